"""SSHSIG format, strict parsing and every refusal, with keys made in memory (no processes).

The interoperability with ``ssh-keygen`` itself is in ``test_signing_interop.py``.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import struct
from collections.abc import Callable

import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from teaagent.errors import SignatureError
from teaagent.signing import (
    SSHPrivateKey,
    SSHPublicKey,
    armor,
    parse_public_key,
    parse_sshsig,
    public_key_from_blob,
    signature_to_wire,
    sshsig_sign,
    sshsig_verify,
)

NS = "teaagent-approval"
DATA = b'{"signer":"beta","type":"teaagent.approval","v":1}'


def ssh_string(value: bytes) -> bytes:
    return struct.pack(">I", len(value)) + value


def ssh_mpint(value: int) -> bytes:
    if value == 0:
        return ssh_string(b"")
    return ssh_string(value.to_bytes((value.bit_length() + 8) // 8, "big"))


def signed_data(namespace: str, hash_name: str, data: bytes) -> bytes:
    digest = hashlib.new(hash_name, data).digest()
    return (
        b"SSHSIG"
        + ssh_string(namespace.encode())
        + ssh_string(b"")
        + ssh_string(hash_name.encode())
        + ssh_string(digest)
    )


def sshsig_blob(
    key_blob: bytes,
    signature_field: bytes,
    *,
    namespace: str = NS,
    hash_name: str = "sha512",
    reserved: bytes = b"",
    magic: bytes = b"SSHSIG",
    version: int = 1,
) -> bytes:
    return (
        magic
        + struct.pack(">I", version)
        + ssh_string(key_blob)
        + ssh_string(namespace.encode())
        + ssh_string(reserved)
        + ssh_string(hash_name.encode())
        + ssh_string(signature_field)
    )


def wire(blob: bytes) -> str:
    return base64.b64encode(blob).decode()


@pytest.fixture(scope="module")
def ed_key() -> SSHPrivateKey:
    return SSHPrivateKey.from_cryptography(Ed25519PrivateKey.generate(), comment="beta")


@pytest.fixture(scope="module")
def other_key() -> SSHPrivateKey:
    return SSHPrivateKey.from_cryptography(Ed25519PrivateKey.generate(), comment="gamma")


@pytest.fixture(scope="module")
def rsa_private() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@pytest.fixture(scope="module")
def good_blob(ed_key: SSHPrivateKey) -> bytes:
    return base64.b64decode(signature_to_wire(sshsig_sign(DATA, ed_key, NS)))


# --- the round trip, every in-memory key type ----------------------------------------------------------


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda: Ed25519PrivateKey.generate(), id="ed25519"),
        pytest.param(lambda: ec.generate_private_key(ec.SECP256R1()), id="nistp256"),
        pytest.param(lambda: ec.generate_private_key(ec.SECP384R1()), id="nistp384"),
        pytest.param(lambda: ec.generate_private_key(ec.SECP521R1()), id="nistp521"),
        pytest.param(lambda: rsa.generate_private_key(public_exponent=65537, key_size=2048), id="rsa2048"),
    ],
)
def test_sign_then_verify_round_trip_and_tampering_fails(make: Callable[[], object]) -> None:
    key = SSHPrivateKey.from_cryptography(make())  # type: ignore[arg-type]
    armored = sshsig_sign(DATA, key, NS)
    sshsig_verify(DATA, armored, key.public_key, NS)
    sshsig_verify(DATA, signature_to_wire(armored), key.public_key, NS)
    sshsig_verify(DATA, armored, key.public_key.to_line(), NS)
    with pytest.raises(SignatureError, match=r"^bad signature: it does not verify"):
        sshsig_verify(DATA + b" ", armored, key.public_key, NS)


def test_rsa_signs_with_rsa_sha2_512(rsa_private: rsa.RSAPrivateKey) -> None:
    key = SSHPrivateKey.from_cryptography(rsa_private)
    parsed = parse_sshsig(sshsig_sign(DATA, key, NS))
    assert parsed.hash_algorithm == "sha512"
    assert parsed.signature.startswith(ssh_string(b"rsa-sha2-512"))


def test_armor_is_seventy_character_lines_with_final_newline(ed_key: SSHPrivateKey) -> None:
    armored = sshsig_sign(DATA, ed_key, NS)
    lines = armored.split("\n")
    assert lines[0] == "-----BEGIN SSH SIGNATURE-----"
    assert lines[-2] == "-----END SSH SIGNATURE-----"
    assert lines[-1] == ""
    body = lines[1:-2]
    assert all(len(line) == 70 for line in body[:-1])
    assert 0 < len(body[-1]) <= 70


def test_wire_form_is_one_padded_base64_line(ed_key: SSHPrivateKey, good_blob: bytes) -> None:
    text = signature_to_wire(sshsig_sign(DATA, ed_key, NS))
    assert "\n" not in text
    assert base64.b64decode(text, validate=True) == good_blob
    assert signature_to_wire(text) == text
    assert signature_to_wire(good_blob) == text
    assert armor(good_blob) == sshsig_sign(DATA, ed_key, NS)


@pytest.mark.parametrize("width", [1, 60, 64, 76, 1000])
def test_any_armor_line_width_and_crlf_are_accepted(
    ed_key: SSHPrivateKey, good_blob: bytes, width: int
) -> None:
    text = wire(good_blob)
    body = [text[i : i + width] for i in range(0, len(text), width)]
    armored = "\r\n".join(["-----BEGIN SSH SIGNATURE-----", *body, "-----END SSH SIGNATURE-----"])
    sshsig_verify(DATA, armored, ed_key.public_key, NS)


def test_signature_may_be_bytes_blob_or_base64_bytes(ed_key: SSHPrivateKey, good_blob: bytes) -> None:
    sshsig_verify(DATA, good_blob, ed_key.public_key, NS)
    sshsig_verify(DATA, wire(good_blob).encode(), ed_key.public_key, NS)
    sshsig_verify(DATA, wire(good_blob) + "\n", ed_key.public_key, NS)


def test_public_key_may_be_given_as_its_line(ed_key: SSHPrivateKey, good_blob: bytes) -> None:
    sshsig_verify(DATA, good_blob, ed_key.public_key.to_line(), NS)


def test_sha256_signatures_are_accepted(ed_key: SSHPrivateKey) -> None:
    field = ed_key.sign(signed_data(NS, "sha256", DATA))
    blob = sshsig_blob(ed_key.public_key.blob, field, hash_name="sha256")
    sshsig_verify(DATA, wire(blob), ed_key.public_key, NS)


# --- every refusal, with its sentence ---------------------------------------------------------------


def test_bad_base64_is_refused(ed_key: SSHPrivateKey) -> None:
    with pytest.raises(SignatureError, match=r"^the signature is not valid base64\.$"):
        sshsig_verify(DATA, "U1NIU0lH*AAA", ed_key.public_key, NS)
    with pytest.raises(SignatureError, match="not valid base64"):
        sshsig_verify(DATA, "U1NIU0lHAAAAAQ", ed_key.public_key, NS)  # missing padding
    with pytest.raises(SignatureError, match="not valid base64"):
        sshsig_verify(DATA, "U1NIU0lH AAAAAQ==", ed_key.public_key, NS)


def test_empty_signature_is_refused(ed_key: SSHPrivateKey) -> None:
    for empty in ("", "  \n", b""):
        with pytest.raises(SignatureError, match=r"^the signature is empty\.$"):
            sshsig_verify(DATA, empty, ed_key.public_key, NS)


def test_expected_key_of_wrong_type_is_a_type_error(ed_key: SSHPrivateKey, good_blob: bytes) -> None:
    with pytest.raises(
        TypeError, match="public_key must be an SSHPublicKey or a public key line, not SSHPrivateKey"
    ):
        sshsig_verify(DATA, good_blob, ed_key, NS)  # type: ignore[arg-type]


def test_truncated_blob_is_refused(ed_key: SSHPrivateKey, good_blob: bytes) -> None:
    with pytest.raises(
        SignatureError, match=r"^the signature is truncated: its signature field claims 83 bytes"
    ):
        sshsig_verify(DATA, wire(good_blob[:-5]), ed_key.public_key, NS)
    with pytest.raises(SignatureError, match="ends before the version"):
        sshsig_verify(DATA, wire(good_blob[:8]), ed_key.public_key, NS)
    with pytest.raises(SignatureError, match="ends before the namespace"):
        sshsig_verify(DATA, wire(good_blob[: 10 + 4 + 51]), ed_key.public_key, NS)


def test_wrong_magic_is_refused(ed_key: SSHPrivateKey, good_blob: bytes) -> None:
    with pytest.raises(
        SignatureError, match=r"^the signature does not start with the SSHSIG magic preamble\.$"
    ):
        sshsig_verify(DATA, wire(b"SSHSIH" + good_blob[6:]), ed_key.public_key, NS)


@pytest.mark.parametrize("version", [0, 2, 0xFFFFFFFF])
def test_wrong_version_is_refused(ed_key: SSHPrivateKey, good_blob: bytes, version: int) -> None:
    blob = good_blob[:6] + struct.pack(">I", version) + good_blob[10:]
    with pytest.raises(
        SignatureError, match=f"^the signature has version {version} but only version 1 is supported"
    ):
        sshsig_verify(DATA, wire(blob), ed_key.public_key, NS)


def test_wrong_namespace_is_refused(ed_key: SSHPrivateKey) -> None:
    denial = sshsig_sign(DATA, ed_key, "teaagent-denial")
    with pytest.raises(
        SignatureError,
        match=r"^signature namespace is 'teaagent-denial' but 'teaagent-approval' was expected\.$",
    ):
        sshsig_verify(DATA, denial, ed_key.public_key, "teaagent-approval")


def test_namespace_must_match_exactly(ed_key: SSHPrivateKey) -> None:
    signature = sshsig_sign(DATA, ed_key, NS)
    for near in ("teaagent-approva", "teaagent-approval ", "Teaagent-approval"):
        with pytest.raises(SignatureError, match="signature namespace is"):
            sshsig_verify(DATA, signature, ed_key.public_key, near)


def test_forged_namespace_field_does_not_verify(ed_key: SSHPrivateKey) -> None:
    # A denial signature relabelled as an approval: the namespace is inside the signed data.
    field = ed_key.sign(signed_data("teaagent-denial", "sha512", DATA))
    blob = sshsig_blob(ed_key.public_key.blob, field, namespace=NS)
    with pytest.raises(SignatureError, match=r"^bad signature"):
        sshsig_verify(DATA, wire(blob), ed_key.public_key, NS)


def test_empty_namespace_is_refused(ed_key: SSHPrivateKey, good_blob: bytes) -> None:
    with pytest.raises(SignatureError, match=r"namespace must be a non-empty string"):
        sshsig_verify(DATA, wire(good_blob), ed_key.public_key, "")
    with pytest.raises(SignatureError, match=r"namespace must be a non-empty string"):
        sshsig_sign(DATA, ed_key, "")


@pytest.mark.parametrize("hash_name", ["md5", "sha1", "sha384", "SHA512", ""])
def test_unknown_hash_is_refused(ed_key: SSHPrivateKey, hash_name: str) -> None:
    blob = sshsig_blob(ed_key.public_key.blob, ed_key.sign(b"x"), hash_name=hash_name)
    with pytest.raises(
        SignatureError,
        match=f"^the signature uses hash algorithm '{hash_name}' but only 'sha256' and 'sha512' are allowed",
    ):
        sshsig_verify(DATA, wire(blob), ed_key.public_key, NS)


def test_key_mismatch_is_refused(ed_key: SSHPrivateKey, other_key: SSHPrivateKey, good_blob: bytes) -> None:
    expected = (
        f"^the signature was made by key {ed_key.public_key.fingerprint} "
        f"but key {other_key.public_key.fingerprint} was expected\\.$"
    )
    with pytest.raises(SignatureError, match=expected.replace("+", r"\+")):
        sshsig_verify(DATA, wire(good_blob), other_key.public_key, NS)


def test_embedded_key_is_compared_as_exact_blob(ed_key: SSHPrivateKey) -> None:
    # The right key followed by a stray byte: a different blob, so a different key.
    field = ed_key.sign(signed_data(NS, "sha512", DATA))
    blob = sshsig_blob(ed_key.public_key.blob + b"\x00", field)
    with pytest.raises(SignatureError, match=r"^the signature was made by key SHA256:"):
        sshsig_verify(DATA, wire(blob), ed_key.public_key, NS)
    with pytest.raises(SignatureError, match=r"^the public key has 1 unexpected trailing byte\.$"):
        parse_sshsig(wire(blob)).public_key()


def test_swapped_key_with_valid_signature_from_other_key_is_refused(
    ed_key: SSHPrivateKey, other_key: SSHPrivateKey
) -> None:
    # Other key's genuine signature, but the blob claims our key: the crypto check catches it.
    field = other_key.sign(signed_data(NS, "sha512", DATA))
    blob = sshsig_blob(ed_key.public_key.blob, field)
    with pytest.raises(SignatureError, match=r"^bad signature"):
        sshsig_verify(DATA, wire(blob), ed_key.public_key, NS)


def test_trailing_bytes_after_the_blob_are_refused(ed_key: SSHPrivateKey, good_blob: bytes) -> None:
    with pytest.raises(SignatureError, match=r"^the signature has 1 unexpected trailing byte\.$"):
        sshsig_verify(DATA, wire(good_blob + b"\x00"), ed_key.public_key, NS)
    with pytest.raises(SignatureError, match=r"^the signature has 3 unexpected trailing bytes\.$"):
        sshsig_verify(DATA, wire(good_blob + b"abc"), ed_key.public_key, NS)


def test_trailing_bytes_in_the_signature_field_are_refused(ed_key: SSHPrivateKey) -> None:
    field = ed_key.sign(signed_data(NS, "sha512", DATA)) + b"\x00"
    blob = sshsig_blob(ed_key.public_key.blob, field)
    with pytest.raises(SignatureError, match=r"^the signature field has 1 unexpected trailing byte\.$"):
        sshsig_verify(DATA, wire(blob), ed_key.public_key, NS)


def test_non_empty_reserved_field_is_refused(ed_key: SSHPrivateKey) -> None:
    field = ed_key.sign(signed_data(NS, "sha512", DATA))
    blob = sshsig_blob(ed_key.public_key.blob, field, reserved=b"tag")
    with pytest.raises(SignatureError, match=r"^the signature's reserved field is not empty\.$"):
        sshsig_verify(DATA, wire(blob), ed_key.public_key, NS)


def test_flipped_signature_bit_is_a_bad_signature(ed_key: SSHPrivateKey, good_blob: bytes) -> None:
    blob = bytearray(good_blob)
    blob[-1] ^= 0x01
    with pytest.raises(
        SignatureError, match=r"^bad signature: it does not verify over the signed data with key SHA256:"
    ):
        sshsig_verify(DATA, wire(bytes(blob)), ed_key.public_key, NS)


def test_wrong_signature_algorithm_for_the_key_is_refused(ed_key: SSHPrivateKey) -> None:
    raw = ed_key.sign(signed_data(NS, "sha512", DATA))[4 + 11 + 4 :]
    field = ssh_string(b"ssh-rsa") + ssh_string(raw)
    blob = sshsig_blob(ed_key.public_key.blob, field)
    with pytest.raises(
        SignatureError,
        match=r"^the signature algorithm is 'ssh-rsa' but a ssh-ed25519 key signs with 'ssh-ed25519'\.$",
    ):
        sshsig_verify(DATA, wire(blob), ed_key.public_key, NS)


def test_short_ed25519_signature_is_refused(ed_key: SSHPrivateKey) -> None:
    field = ssh_string(b"ssh-ed25519") + ssh_string(b"\x00" * 63)
    blob = sshsig_blob(ed_key.public_key.blob, field)
    with pytest.raises(SignatureError, match=r"^the Ed25519 signature is 63 bytes long instead of 64\.$"):
        sshsig_verify(DATA, wire(blob), ed_key.public_key, NS)


def test_armor_without_its_end_line_is_refused(ed_key: SSHPrivateKey, good_blob: bytes) -> None:
    armored = armor(good_blob)
    with pytest.raises(SignatureError, match="does not end with '-----END SSH SIGNATURE-----'"):
        sshsig_verify(DATA, armored.replace("-----END SSH SIGNATURE-----", ""), ed_key.public_key, NS)
    with pytest.raises(SignatureError, match="does not start with '-----BEGIN SSH SIGNATURE-----'"):
        sshsig_verify(DATA, armored.replace("BEGIN SSH", "BEGIN PGP"), ed_key.public_key, NS)


def test_oversized_signature_is_refused(ed_key: SSHPrivateKey) -> None:
    with pytest.raises(SignatureError, match=r"^the signature is longer than 32768 characters\.$"):
        sshsig_verify(DATA, "A" * (32 * 1024 + 4), ed_key.public_key, NS)
    with pytest.raises(SignatureError, match=r"^the signature is longer than 32768 bytes\.$"):
        sshsig_verify(DATA, b"SSHSIG" + b"\x00" * (32 * 1024), ed_key.public_key, NS)


def test_signature_of_wrong_type_is_refused(ed_key: SSHPrivateKey) -> None:
    with pytest.raises(SignatureError, match="must be text or bytes, not int"):
        sshsig_verify(DATA, 12, ed_key.public_key, NS)  # type: ignore[arg-type]


# --- ECDSA and RSA specifics ------------------------------------------------------------------------


def test_ecdsa_non_minimal_mpint_is_refused() -> None:
    private = ec.generate_private_key(ec.SECP256R1())
    key = SSHPrivateKey.from_cryptography(private)
    r, s = decode_dss_signature(private.sign(signed_data(NS, "sha512", DATA), ec.ECDSA(hashes.SHA256())))
    padded_r = ssh_string(b"\x00\x00" + r.to_bytes(32, "big"))
    field = ssh_string(b"ecdsa-sha2-nistp256") + ssh_string(padded_r + ssh_mpint(s))
    blob = sshsig_blob(key.public_key.blob, field)
    with pytest.raises(SignatureError, match=r"^the ECDSA signature's r value is not minimally encoded\.$"):
        sshsig_verify(DATA, wire(blob), key.public_key, NS)
    good = ssh_string(b"ecdsa-sha2-nistp256") + ssh_string(ssh_mpint(r) + ssh_mpint(s))
    sshsig_verify(DATA, wire(sshsig_blob(key.public_key.blob, good)), key.public_key, NS)


def test_ecdsa_signature_with_wrong_curve_hash_is_refused() -> None:
    private = ec.generate_private_key(ec.SECP384R1())
    key = SSHPrivateKey.from_cryptography(private)
    r, s = decode_dss_signature(private.sign(signed_data(NS, "sha512", DATA), ec.ECDSA(hashes.SHA256())))
    field = ssh_string(b"ecdsa-sha2-nistp384") + ssh_string(ssh_mpint(r) + ssh_mpint(s))
    with pytest.raises(SignatureError, match=r"^bad signature"):
        sshsig_verify(DATA, wire(sshsig_blob(key.public_key.blob, field)), key.public_key, NS)


def test_rsa_sha1_signature_is_refused(rsa_private: rsa.RSAPrivateKey) -> None:
    key = SSHPrivateKey.from_cryptography(rsa_private)
    raw = rsa_private.sign(signed_data(NS, "sha512", DATA), padding.PKCS1v15(), hashes.SHA1())  # noqa: S303
    blob = sshsig_blob(key.public_key.blob, ssh_string(b"ssh-rsa") + ssh_string(raw))
    with pytest.raises(
        SignatureError,
        match=r"^RSA signatures with SHA-1 \('ssh-rsa'\) are refused; "
        r"sign with rsa-sha2-512 or rsa-sha2-256\.$",
    ):
        sshsig_verify(DATA, wire(blob), key.public_key, NS)


def test_rsa_sha2_256_signature_is_accepted(rsa_private: rsa.RSAPrivateKey) -> None:
    key = SSHPrivateKey.from_cryptography(rsa_private)
    raw = rsa_private.sign(signed_data(NS, "sha512", DATA), padding.PKCS1v15(), hashes.SHA256())
    blob = sshsig_blob(key.public_key.blob, ssh_string(b"rsa-sha2-256") + ssh_string(raw))
    sshsig_verify(DATA, wire(blob), key.public_key, NS)


def test_rsa_signature_algorithm_name_binds_the_hash(rsa_private: rsa.RSAPrivateKey) -> None:
    key = SSHPrivateKey.from_cryptography(rsa_private)
    raw = rsa_private.sign(signed_data(NS, "sha512", DATA), padding.PKCS1v15(), hashes.SHA256())
    blob = sshsig_blob(key.public_key.blob, ssh_string(b"rsa-sha2-512") + ssh_string(raw))
    with pytest.raises(SignatureError, match=r"^bad signature"):
        sshsig_verify(DATA, wire(blob), key.public_key, NS)


def test_rsa_signature_longer_than_modulus_is_refused(rsa_private: rsa.RSAPrivateKey) -> None:
    key = SSHPrivateKey.from_cryptography(rsa_private)
    blob = sshsig_blob(key.public_key.blob, ssh_string(b"rsa-sha2-512") + ssh_string(b"\x01" * 257))
    with pytest.raises(SignatureError, match=r"^the RSA signature is longer than the key's modulus\.$"):
        sshsig_verify(DATA, wire(blob), key.public_key, NS)


def test_rsa_signature_without_leading_zeros_is_accepted(rsa_private: rsa.RSAPrivateKey) -> None:
    key = SSHPrivateKey.from_cryptography(rsa_private)
    # About one RSA signature in 256 starts with a zero byte; 5000 tries miss one with odds of e^-19.
    for attempt in range(5000):
        data = DATA + str(attempt).encode()
        raw = rsa_private.sign(signed_data(NS, "sha512", data), padding.PKCS1v15(), hashes.SHA512())
        if raw[0] == 0:
            break
    else:
        pytest.fail("no RSA signature with a leading zero byte in 5000 tries")
    blob = sshsig_blob(key.public_key.blob, ssh_string(b"rsa-sha2-512") + ssh_string(raw.lstrip(b"\x00")))
    sshsig_verify(data, wire(blob), key.public_key, NS)


# --- security keys (PROTOCOL.u2f), signatures made in software -------------------------------------

USER_PRESENT = 0x01
USER_VERIFIED = 0x04


def sk_ed25519(application: bytes = b"ssh:") -> tuple[Ed25519PrivateKey, SSHPublicKey]:
    private = Ed25519PrivateKey.generate()
    raw = private.public_key().public_bytes_raw()
    blob = ssh_string(b"sk-ssh-ed25519@openssh.com") + ssh_string(raw) + ssh_string(application)
    return private, public_key_from_blob(blob)


def sk_ecdsa(application: bytes = b"ssh:") -> tuple[ec.EllipticCurvePrivateKey, SSHPublicKey]:
    from cryptography.hazmat.primitives import serialization

    private = ec.generate_private_key(ec.SECP256R1())
    point = private.public_key().public_bytes(
        serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint
    )
    blob = ssh_string(b"sk-ecdsa-sha2-nistp256@openssh.com") + ssh_string(b"nistp256") + ssh_string(point)
    return private, public_key_from_blob(blob + ssh_string(application))


def sk_message(application: bytes, flags: int, counter: int, message: bytes) -> bytes:
    return (
        hashlib.sha256(application).digest()
        + bytes([flags])
        + struct.pack(">I", counter)
        + hashlib.sha256(message).digest()
    )


def sk_ed25519_sshsig(
    private: Ed25519PrivateKey, public: SSHPublicKey, flags: int, counter: int = 7
) -> bytes:
    raw = private.sign(sk_message(b"ssh:", flags, counter, signed_data(NS, "sha512", DATA)))
    field = (
        ssh_string(b"sk-ssh-ed25519@openssh.com")
        + ssh_string(raw)
        + bytes([flags])
        + struct.pack(">I", counter)
    )
    return sshsig_blob(public.blob, field)


def sk_ecdsa_sshsig(
    private: ec.EllipticCurvePrivateKey, public: SSHPublicKey, flags: int, counter: int = 7, name: bytes = b""
) -> bytes:
    der = private.sign(
        sk_message(b"ssh:", flags, counter, signed_data(NS, "sha512", DATA)), ec.ECDSA(hashes.SHA256())
    )
    r, s = decode_dss_signature(der)
    name = name or b"sk-ecdsa-sha2-nistp256@openssh.com"
    field = (
        ssh_string(name)
        + ssh_string(ssh_mpint(r) + ssh_mpint(s))
        + bytes([flags])
        + struct.pack(">I", counter)
    )
    return sshsig_blob(public.blob, field)


@pytest.mark.parametrize("flags", [USER_PRESENT, USER_PRESENT | USER_VERIFIED, 0x21])
def test_sk_ed25519_with_user_presence_verifies(flags: int) -> None:
    private, public = sk_ed25519()
    assert public.key_type == "sk-ssh-ed25519@openssh.com"
    assert public.application == "ssh:"
    sshsig_verify(DATA, wire(sk_ed25519_sshsig(private, public, flags)), public, NS)


@pytest.mark.parametrize("flags", [0x00, USER_VERIFIED])
def test_sk_ed25519_without_user_presence_is_refused(flags: int) -> None:
    private, public = sk_ed25519()
    with pytest.raises(
        SignatureError,
        match=r"^the security-key signature was made without user presence \(no touch\), which is refused\.$",
    ):
        sshsig_verify(DATA, wire(sk_ed25519_sshsig(private, public, flags)), public, NS)


def test_sk_ed25519_flags_are_signed() -> None:
    # Setting the presence bit afterwards breaks the signature: the flags are inside the signed bytes.
    private, public = sk_ed25519()
    blob = bytearray(sk_ed25519_sshsig(private, public, 0x00))
    blob[-5] |= USER_PRESENT
    with pytest.raises(SignatureError, match=r"^bad signature"):
        sshsig_verify(DATA, wire(bytes(blob)), public, NS)


def test_sk_ed25519_application_is_bound() -> None:
    private, public = sk_ed25519(b"ssh:other")
    with pytest.raises(SignatureError, match=r"^bad signature"):
        sshsig_verify(DATA, wire(sk_ed25519_sshsig(private, public, USER_PRESENT)), public, NS)


def test_sk_ecdsa_with_user_presence_verifies() -> None:
    private, public = sk_ecdsa()
    assert public.key_type == "sk-ecdsa-sha2-nistp256@openssh.com"
    sshsig_verify(DATA, wire(sk_ecdsa_sshsig(private, public, USER_PRESENT)), public, NS)


def test_sk_ecdsa_without_user_presence_is_refused() -> None:
    private, public = sk_ecdsa()
    with pytest.raises(SignatureError, match="without user presence"):
        sshsig_verify(DATA, wire(sk_ecdsa_sshsig(private, public, 0)), public, NS)


def test_sk_ecdsa_counter_is_signed() -> None:
    private, public = sk_ecdsa()
    blob = bytearray(sk_ecdsa_sshsig(private, public, USER_PRESENT, counter=7))
    blob[-1] = 8
    with pytest.raises(SignatureError, match=r"^bad signature"):
        sshsig_verify(DATA, wire(bytes(blob)), public, NS)


def test_webauthn_sk_signature_is_refused() -> None:
    private, public = sk_ecdsa()
    blob = sk_ecdsa_sshsig(private, public, USER_PRESENT, name=b"webauthn-sk-ecdsa-sha2-nistp256@openssh.com")
    with pytest.raises(SignatureError, match=r"^WebAuthn security-key signatures are not supported\.$"):
        sshsig_verify(DATA, wire(blob), public, NS)


def test_sk_signature_missing_counter_is_truncated() -> None:
    private, public = sk_ed25519()
    raw = private.sign(b"x")
    field = ssh_string(b"sk-ssh-ed25519@openssh.com") + ssh_string(raw) + bytes([USER_PRESENT])
    with pytest.raises(
        SignatureError, match=r"^the signature field is truncated: it ends before the security-key counter"
    ):
        sshsig_verify(DATA, wire(sshsig_blob(public.blob, field)), public, NS)


# --- fuzzing: only SignatureError may come out ------------------------------------------------------

FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def fuzz_keys() -> list[tuple[SSHPublicKey, bytes]]:
    """(key, valid SSHSIG blob) for ed25519, ECDSA, RSA and both security-key types."""
    out = []
    for private in (
        Ed25519PrivateKey.generate(),
        ec.generate_private_key(ec.SECP256R1()),
        rsa.generate_private_key(public_exponent=65537, key_size=2048),
    ):
        key = SSHPrivateKey.from_cryptography(private)
        out.append((key.public_key, base64.b64decode(signature_to_wire(sshsig_sign(DATA, key, NS)))))
    sk_private, sk_public = sk_ed25519()
    out.append((sk_public, sk_ed25519_sshsig(sk_private, sk_public, USER_PRESENT)))
    ec_private, ec_public = sk_ecdsa()
    out.append((ec_public, sk_ecdsa_sshsig(ec_private, ec_public, USER_PRESENT)))
    return out


def _mutate(blob: bytes, edits: list[tuple[int, int, int]]) -> bytes:
    out = bytearray(blob)
    for kind, position, value in edits:
        if not out:
            out.append(value)
            continue
        index = position % len(out)
        if kind == 0:
            out[index] = value
        elif kind == 1:
            out[index] ^= 1 << (value % 8)
        elif kind == 2:
            del out[index:]
        elif kind == 3:
            out.insert(index, value)
        else:
            del out[index]
    return bytes(out)


_EDITS = st.lists(
    st.tuples(st.integers(0, 4), st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=4
)


@FUZZ
@given(index=st.integers(0, 4), edits=_EDITS, form=st.sampled_from(["wire", "armor", "bytes"]))
def test_fuzz_mutated_blobs_raise_only_signature_error(
    fuzz_keys: list[tuple[SSHPublicKey, bytes]], index: int, edits: list[tuple[int, int, int]], form: str
) -> None:
    public, blob = fuzz_keys[index]
    mutated = _mutate(blob, edits)
    signature: str | bytes = {"wire": wire(mutated), "armor": armor(mutated), "bytes": mutated}[form]
    with contextlib.suppress(SignatureError):
        parse_sshsig(signature).public_key()
    try:
        sshsig_verify(DATA, signature, public, NS)
    except SignatureError:
        return
    assert mutated == blob  # only an edit that changed nothing may pass


@FUZZ
@given(text=st.text(max_size=400))
def test_fuzz_random_text_raises_only_signature_error(
    fuzz_keys: list[tuple[SSHPublicKey, bytes]], text: str
) -> None:
    with pytest.raises(SignatureError):
        sshsig_verify(DATA, text, fuzz_keys[0][0], NS)
    with pytest.raises(SignatureError):
        sshsig_verify(
            DATA,
            "-----BEGIN SSH SIGNATURE-----\n" + text + "\n-----END SSH SIGNATURE-----",
            fuzz_keys[0][0],
            NS,
        )


@FUZZ
@given(
    key_blob=st.binary(max_size=80),
    namespace=st.binary(max_size=24),
    reserved=st.binary(max_size=4),
    hash_name=st.sampled_from([b"sha512", b"sha256", b"md5", b"", b"\xff\xfe"]),
    field=st.binary(max_size=120),
    index=st.integers(0, 4),
)
def test_fuzz_structured_blobs_raise_only_signature_error(
    fuzz_keys: list[tuple[SSHPublicKey, bytes]],
    key_blob: bytes,
    namespace: bytes,
    reserved: bytes,
    hash_name: bytes,
    field: bytes,
    index: int,
) -> None:
    public = fuzz_keys[index][0]
    for embedded in (key_blob, public.blob):
        blob = (
            b"SSHSIG\x00\x00\x00\x01"
            + ssh_string(embedded)
            + ssh_string(namespace)
            + ssh_string(reserved)
            + ssh_string(hash_name)
            + ssh_string(field)
        )
        with pytest.raises(SignatureError):
            sshsig_verify(DATA, wire(blob), public, NS)
        with pytest.raises(SignatureError):
            sshsig_verify(DATA, wire(blob), public, namespace.decode("utf-8", "replace") or "x")


@FUZZ
@given(index=st.integers(0, 4), field_edits=_EDITS)
def test_fuzz_signature_fields_raise_only_signature_error(
    fuzz_keys: list[tuple[SSHPublicKey, bytes]], index: int, field_edits: list[tuple[int, int, int]]
) -> None:
    public, blob = fuzz_keys[index]
    parsed = parse_sshsig(blob)
    field = _mutate(parsed.signature, field_edits)
    mutated = sshsig_blob(public.blob, field)
    try:
        sshsig_verify(DATA, wire(mutated), public, NS)
    except SignatureError:
        return
    assert field == parsed.signature


@FUZZ
@given(key_blob=st.binary(max_size=200), edits=_EDITS, index=st.integers(0, 4))
def test_fuzz_public_keys_raise_only_signature_error(
    fuzz_keys: list[tuple[SSHPublicKey, bytes]],
    key_blob: bytes,
    edits: list[tuple[int, int, int]],
    index: int,
) -> None:
    for candidate in (key_blob, _mutate(fuzz_keys[index][0].blob, edits)):
        try:
            key = public_key_from_blob(candidate)
        except SignatureError:
            continue
        assert key.blob == candidate
        line = key.to_line()
        assert parse_public_key(line) == key


@FUZZ
@given(line=st.text(max_size=300))
def test_fuzz_public_key_lines_raise_only_signature_error(line: str) -> None:
    try:
        key = parse_public_key(line)
    except SignatureError:
        return
    assert parse_public_key(key.to_line()) == key
