"""OpenSSH's own ``ssh-keygen`` as the oracle: fingerprints, and SSHSIG both ways for every key type.

Every test here starts ``ssh-keygen`` processes, so all are marked slow.
"""

from __future__ import annotations

import base64
import hashlib
import struct
import subprocess
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

from teaagent.errors import ConfigError, SignatureError
from teaagent.signing import (
    armor,
    fingerprint,
    load_private_key,
    parse_public_key,
    parse_sshsig,
    public_key_from_blob,
    signature_to_wire,
    sshsig_sign,
    sshsig_verify,
)

pytestmark = pytest.mark.slow

NS = "teaagent-approval"
DATA = b'{"request_id":"0123456789abcdef0123456789abcdef","signer":"beta","v":1}'

KEY_SPECS = [
    pytest.param("ed25519", None, id="ed25519"),
    pytest.param("ecdsa", 256, id="nistp256"),
    pytest.param("ecdsa", 384, id="nistp384"),
    pytest.param("ecdsa", 521, id="nistp521"),
    pytest.param("rsa", 2048, id="rsa2048"),
    pytest.param("rsa", 3072, id="rsa3072"),
]
EXPECTED_TYPES = {
    ("ed25519", None): "ssh-ed25519",
    ("ecdsa", 256): "ecdsa-sha2-nistp256",
    ("ecdsa", 384): "ecdsa-sha2-nistp384",
    ("ecdsa", 521): "ecdsa-sha2-nistp521",
    ("rsa", 2048): "ssh-rsa",
    ("rsa", 3072): "ssh-rsa",
}


def ssh_string(value: bytes) -> bytes:
    return struct.pack(">I", len(value)) + value


def ssh_mpint(value: int) -> bytes:
    return ssh_string(value.to_bytes((value.bit_length() + 8) // 8, "big"))


def signed_data(namespace: str, data: bytes) -> bytes:
    digest = hashlib.sha512(data).digest()
    return (
        b"SSHSIG"
        + ssh_string(namespace.encode())
        + ssh_string(b"")
        + ssh_string(b"sha512")
        + ssh_string(digest)
    )


def sshsig_blob(key_blob: bytes, field: bytes, namespace: str = NS) -> bytes:
    return (
        b"SSHSIG\x00\x00\x00\x01"
        + ssh_string(key_blob)
        + ssh_string(namespace.encode())
        + ssh_string(b"")
        + ssh_string(b"sha512")
        + ssh_string(field)
    )


class Keygen:
    """Runs ``ssh-keygen -Y`` in one directory."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.data = folder / "statement.json"
        self.data.write_bytes(DATA)

    def verify(self, signature: str, public_line: str, namespace: str = NS) -> bool:
        allowed = self.folder / "allowed_signers"
        allowed.write_text(f"beta {public_line}\n")
        sig = self.folder / "statement.json.sig"
        sig.write_text(signature)
        result = subprocess.run(
            ["ssh-keygen", "-Y", "verify", "-f", str(allowed), "-I", "beta", "-n", namespace, "-s", str(sig)],
            input=DATA,
            capture_output=True,
            check=False,
        )
        good = result.returncode == 0
        assert good == result.stdout.startswith(b"Good"), result
        return good

    def sign(self, private_path: Path, namespace: str = NS, extra: tuple[str, ...] = ()) -> str:
        sig = self.folder / "statement.json.sig"
        sig.unlink(missing_ok=True)
        subprocess.run(
            ["ssh-keygen", "-Y", "sign", "-f", str(private_path), "-n", namespace, *extra, str(self.data)],
            check=True,
            capture_output=True,
        )
        return sig.read_text()


@pytest.fixture
def keygen(tmp_path: Path) -> Keygen:
    return Keygen(tmp_path)


@pytest.fixture(scope="module")
def make_key(
    ssh_key_factory: Callable[..., Any], tmp_path_factory: pytest.TempPathFactory
) -> Callable[..., Any]:
    """Like ``ssh_key_factory``, with ``-b BITS`` placed after the key type for sized keys."""
    folder = tmp_path_factory.mktemp("sized-keys")
    cache: dict[tuple[str, str, int | None, str], Any] = {}

    def make(name: str, key_type: str = "ed25519", bits: int | None = None, passphrase: str = "") -> Any:
        if bits is None:
            return ssh_key_factory(name, key_type, None, passphrase)
        if (name, key_type, bits, passphrase) not in cache:
            path = folder / f"{name}-{key_type}-{bits}-{len(passphrase)}"
            subprocess.run(
                [
                    "ssh-keygen",
                    "-q",
                    "-t",
                    key_type,
                    "-b",
                    str(bits),
                    "-N",
                    passphrase,
                    "-C",
                    name,
                    "-f",
                    str(path),
                ],
                check=True,
                capture_output=True,
            )
            public_line = Path(f"{path}.pub").read_text().strip()
            cache[(name, key_type, bits, passphrase)] = SimpleNamespace(
                private_path=path, public_path=Path(f"{path}.pub"), public_line=public_line
            )
        return cache[(name, key_type, bits, passphrase)]

    return make


@pytest.mark.parametrize(("key_type", "bits"), KEY_SPECS)
def test_fingerprint_matches_ssh_keygen_lf(
    make_key: Callable[..., Any], key_type: str, bits: int | None
) -> None:
    key = make_key("beta", key_type, bits)
    printed = subprocess.run(
        ["ssh-keygen", "-lf", str(key.public_path)], capture_output=True, text=True, check=True
    ).stdout.split()
    public = parse_public_key(key.public_line)
    assert public.key_type == EXPECTED_TYPES[(key_type, bits)]
    assert fingerprint(public) == printed[1]
    assert str(public.bits) == printed[0]
    assert load_private_key(key.private_path).public_key == public
    assert load_private_key(key.private_path).public_key.comment == "beta"


@pytest.mark.parametrize(("key_type", "bits"), KEY_SPECS)
def test_ssh_keygen_verifies_our_signatures(
    make_key: Callable[..., Any], keygen: Keygen, key_type: str, bits: int | None
) -> None:
    key = make_key("beta", key_type, bits)
    ours = sshsig_sign(DATA, load_private_key(key.private_path), NS)
    assert keygen.verify(ours, key.public_line)
    # The oracle can say no: the same signature under another namespace fails.
    assert not keygen.verify(ours, key.public_line, namespace="teaagent-denial")


@pytest.mark.parametrize(("key_type", "bits"), KEY_SPECS)
def test_we_verify_ssh_keygen_signatures(
    make_key: Callable[..., Any], keygen: Keygen, key_type: str, bits: int | None
) -> None:
    key = make_key("beta", key_type, bits)
    theirs = keygen.sign(key.private_path)
    public = parse_public_key(key.public_line)
    sshsig_verify(DATA, theirs, public, NS)
    sshsig_verify(DATA, signature_to_wire(theirs), public, NS)
    with pytest.raises(SignatureError, match=r"^bad signature"):
        sshsig_verify(DATA.replace(b"beta", b"gama"), theirs, public, NS)
    with pytest.raises(
        SignatureError, match=r"^signature namespace is 'teaagent-approval' but 'teaagent-denial'"
    ):
        sshsig_verify(DATA, theirs, public, "teaagent-denial")
    if key_type == "rsa":
        assert parse_sshsig(theirs).signature.startswith(ssh_string(b"rsa-sha2-512"))


def test_ed25519_output_is_byte_identical_to_ssh_keygen(
    ssh_key_factory: Callable[..., Any], keygen: Keygen
) -> None:
    key = ssh_key_factory("beta")
    theirs = keygen.sign(key.private_path)
    assert sshsig_sign(DATA, load_private_key(key.private_path), NS) == theirs
    assert armor(base64.b64decode(signature_to_wire(theirs))) == theirs


def test_ssh_keygen_sha256_signatures_verify(ssh_key_factory: Callable[..., Any], keygen: Keygen) -> None:
    key = ssh_key_factory("beta")
    theirs = keygen.sign(key.private_path, extra=("-O", "hashalg=sha256"))
    assert parse_sshsig(theirs).hash_algorithm == "sha256"
    sshsig_verify(DATA, theirs, key.public_line, NS)


def test_passphrase_protected_key(ssh_key_factory: Callable[..., Any], keygen: Keygen) -> None:
    key = ssh_key_factory("locked", passphrase="correct horse battery")
    loaded = load_private_key(key.private_path, "correct horse battery")
    assert loaded.public_key == parse_public_key(key.public_line)
    assert keygen.verify(sshsig_sign(DATA, loaded, NS), key.public_line)
    assert load_private_key(key.private_path, b"correct horse battery").public_key == loaded.public_key
    with pytest.raises(ConfigError, match=r"^the passphrase for the private key .* is wrong\.$"):
        load_private_key(key.private_path, "wrong horse")
    with pytest.raises(
        ConfigError, match=r"^the private key .* is protected by a passphrase, and none was given\.$"
    ):
        load_private_key(key.private_path)
    with pytest.raises(ConfigError, match=r"is protected by a passphrase, and none was given\.$"):
        load_private_key(key.private_path, "")
    with pytest.raises(ConfigError, match=r"is wrong\.$"):
        load_private_key(key.private_path, "correct horse\nbattery")


def test_passphrase_protected_rsa_key(make_key: Callable[..., Any], keygen: Keygen) -> None:
    key = make_key("locked", "rsa", 2048, passphrase="pw")
    loaded = load_private_key(key.private_path, "pw")
    assert keygen.verify(sshsig_sign(DATA, loaded, NS), key.public_line)


def test_pem_format_key_from_ssh_keygen(tmp_path: Path, keygen: Keygen) -> None:
    path = tmp_path / "pem_rsa"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "rsa", "-b", "2048", "-m", "PEM", "-N", "", "-C", "pem", "-f", str(path)],
        check=True,
        capture_output=True,
    )
    assert path.read_text().startswith("-----BEGIN RSA PRIVATE KEY-----")
    loaded = load_private_key(path)
    public_line = (tmp_path / "pem_rsa.pub").read_text().strip()
    assert loaded.public_key == parse_public_key(public_line)
    assert keygen.verify(sshsig_sign(DATA, loaded, NS), public_line)


def test_rsa_1024_is_refused_everywhere(make_key: Callable[..., Any], keygen: Keygen) -> None:
    key = make_key("small", "rsa", 1024)
    message = r"RSA keys of 1024 bits are refused: at least 2048 bits are required\.$"
    with pytest.raises(SignatureError, match="^" + message):
        parse_public_key(key.public_line)
    with pytest.raises(ConfigError, match=message):
        load_private_key(key.private_path)
    theirs = keygen.sign(key.private_path)
    with pytest.raises(SignatureError, match="^" + message):
        sshsig_verify(DATA, theirs, key.public_line, NS)
    with pytest.raises(SignatureError, match="^" + message):
        parse_sshsig(theirs).public_key()


def test_ssh_rsa_sha1_signature_is_refused_by_us_and_by_ssh_keygen(
    make_key: Callable[..., Any], keygen: Keygen
) -> None:
    key = make_key("beta", "rsa", 2048)
    private = serialization.load_ssh_private_key(key.private_path.read_bytes(), None)
    assert isinstance(private, rsa.RSAPrivateKey)
    public = parse_public_key(key.public_line)
    message = signed_data(NS, DATA)
    # The framing is right: the same construction with SHA-512 satisfies ssh-keygen.
    good = private.sign(message, padding.PKCS1v15(), hashes.SHA512())
    good_blob = sshsig_blob(public.blob, ssh_string(b"rsa-sha2-512") + ssh_string(good))
    assert keygen.verify(armor(good_blob), key.public_line)
    sshsig_verify(DATA, base64.b64encode(good_blob).decode(), public, NS)
    sha1 = private.sign(message, padding.PKCS1v15(), hashes.SHA1())  # noqa: S303 - the refused case
    sha1_blob = sshsig_blob(public.blob, ssh_string(b"ssh-rsa") + ssh_string(sha1))
    assert not keygen.verify(armor(sha1_blob), key.public_line)
    with pytest.raises(SignatureError, match=r"^RSA signatures with SHA-1 \('ssh-rsa'\) are refused"):
        sshsig_verify(DATA, armor(sha1_blob), public, NS)


# --- security keys: software-made PROTOCOL.u2f signatures, judged by ssh-keygen too ------------------


def _sk_ed25519_blob(flags: int) -> tuple[str, bytes]:
    private = Ed25519PrivateKey.generate()
    key_blob = (
        ssh_string(b"sk-ssh-ed25519@openssh.com")
        + ssh_string(private.public_key().public_bytes_raw())
        + ssh_string(b"ssh:")
    )
    counter = 42
    signed = (
        hashlib.sha256(b"ssh:").digest()
        + bytes([flags])
        + struct.pack(">I", counter)
        + hashlib.sha256(signed_data(NS, DATA)).digest()
    )
    field = (
        ssh_string(b"sk-ssh-ed25519@openssh.com")
        + ssh_string(private.sign(signed))
        + bytes([flags])
        + struct.pack(">I", counter)
    )
    return public_key_from_blob(key_blob).to_line(), sshsig_blob(key_blob, field)


def _sk_ecdsa_blob(flags: int) -> tuple[str, bytes]:
    private = ec.generate_private_key(ec.SECP256R1())
    point = private.public_key().public_bytes(
        serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint
    )
    key_blob = (
        ssh_string(b"sk-ecdsa-sha2-nistp256@openssh.com")
        + ssh_string(b"nistp256")
        + ssh_string(point)
        + ssh_string(b"ssh:")
    )
    counter = 9
    signed = (
        hashlib.sha256(b"ssh:").digest()
        + bytes([flags])
        + struct.pack(">I", counter)
        + hashlib.sha256(signed_data(NS, DATA)).digest()
    )
    r, s = decode_dss_signature(private.sign(signed, ec.ECDSA(hashes.SHA256())))
    field = (
        ssh_string(b"sk-ecdsa-sha2-nistp256@openssh.com")
        + ssh_string(ssh_mpint(r) + ssh_mpint(s))
        + bytes([flags])
        + struct.pack(">I", counter)
    )
    return public_key_from_blob(key_blob).to_line(), sshsig_blob(key_blob, field)


@pytest.mark.parametrize("make", [_sk_ed25519_blob, _sk_ecdsa_blob], ids=["sk-ed25519", "sk-ecdsa"])
def test_security_key_signatures_agree_with_ssh_keygen(
    keygen: Keygen, make: Callable[[int], tuple[str, bytes]]
) -> None:
    line, touched = make(0x01)
    assert keygen.verify(armor(touched), line)
    sshsig_verify(DATA, armor(touched), line, NS)
    assert (
        fingerprint(line)
        == subprocess.run(
            ["ssh-keygen", "-lf", "-"], input=line, capture_output=True, text=True, check=True
        ).stdout.split()[1]
    )

    # Without the presence flag the signature is still cryptographically sound (ssh-keygen -Y verify,
    # which leaves touch policy to sshd, accepts it), so teaagent's refusal is the policy alone.
    line, untouched = make(0x00)
    assert keygen.verify(armor(untouched), line)
    with pytest.raises(SignatureError, match="without user presence"):
        sshsig_verify(DATA, armor(untouched), line, NS)


def test_dsa_key_from_ssh_keygen_is_refused(keygen: Keygen, tmp_path: Path) -> None:
    result = subprocess.run(
        ["ssh-keygen", "-q", "-t", "dsa", "-N", "", "-f", str(tmp_path / "dsa")],
        capture_output=True,
        check=False,
    )
    if result.returncode != 0:
        pytest.skip("this ssh-keygen no longer makes DSA keys")
    with pytest.raises(SignatureError, match=r"^DSA keys \(ssh-dss\) are refused"):
        parse_public_key((tmp_path / "dsa.pub").read_text())
    with pytest.raises(
        ConfigError, match=r"is refused: DSA keys \(ssh-dss\) are refused; use an ed25519 key\.$"
    ):
        load_private_key(tmp_path / "dsa")
