"""teaagent.signing: public key lines, fingerprints and private key files (no processes started).

SSHSIG itself is in ``test_signing_sshsig.py``; ``ssh-keygen`` as the oracle in
``test_signing_interop.py``; ssh-agent in ``test_signing_agent.py``.
"""

from __future__ import annotations

import base64
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import dsa, ec, rsa
from cryptography.hazmat.primitives.asymmetric.ed448 import Ed448PrivateKey
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from key_forms import sk_form

import teaagent.signing
from teaagent.errors import ConfigError, SignatureError
from teaagent.signing import (
    AgentSigner,
    Signer,
    SSHPrivateKey,
    SSHPublicKey,
    fingerprint,
    load_private_key,
    parse_public_key,
    public_key_from_blob,
    signature_to_wire,
    sshsig_sign,
    sshsig_verify,
)

# A published example key; its fingerprint as printed by `ssh-keygen -lf`.
EXAMPLE_LINE = (
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAo3D7CGN01tTYY/dLKXEv8RxRyxa32c51X0uKMhnMab wim@localhost"
)
EXAMPLE_FINGERPRINT = "SHA256:psM4rr0Rhr/+U+ci7O+bJ/gKf3JaeYEveSJ+iCnRoJQ"


def ssh_string(value: bytes) -> bytes:
    return struct.pack(">I", len(value)) + value


def ssh_mpint(value: int) -> bytes:
    return ssh_string(value.to_bytes((value.bit_length() + 8) // 8, "big"))


def line_for(blob: bytes, key_type: str | None = None) -> str:
    name = key_type or blob[4 : 4 + struct.unpack(">I", blob[:4])[0]].decode()
    return f"{name} {base64.b64encode(blob).decode()}"


# --- the public face -----------------------------------------------------------------------------------


def test_every_public_name_is_exported() -> None:
    for name in teaagent.signing.__all__:
        assert getattr(teaagent.signing, name) is not None
    assert teaagent.signing.SignatureError is SignatureError


@pytest.mark.slow
@pytest.mark.parametrize(
    "module",
    [
        "teaagent.signing",
        "teaagent.signing._wire",
        "teaagent.signing._keys",
        "teaagent.signing._sshsig",
        "teaagent.signing._private",
        "teaagent.signing._agent",
    ],
)
def test_each_module_imports_first_in_a_fresh_interpreter(module: str) -> None:
    result = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


# --- public key lines ---------------------------------------------------------------------------------


def test_parse_keeps_type_blob_and_comment() -> None:
    key = parse_public_key(EXAMPLE_LINE + "\n")
    assert key.key_type == "ssh-ed25519"
    assert key.blob == base64.b64decode(EXAMPLE_LINE.split()[1])
    assert key.comment == "wim@localhost"
    assert key.bits == 256
    assert key.to_line() == EXAMPLE_LINE
    assert str(key) == EXAMPLE_LINE
    assert key.fingerprint == EXAMPLE_FINGERPRINT
    assert fingerprint(key) == EXAMPLE_FINGERPRINT
    assert fingerprint(EXAMPLE_LINE) == EXAMPLE_FINGERPRINT


def test_bare_type_and_base64_form_is_accepted() -> None:
    bare = " ".join(EXAMPLE_LINE.split()[:2])
    key = parse_public_key(bare)
    assert key.comment == ""
    assert key.to_line() == bare
    assert key == parse_public_key(EXAMPLE_LINE)


def test_comment_with_spaces_is_kept_whole() -> None:
    key = parse_public_key(" ".join(EXAMPLE_LINE.split()[:2]) + "  beta node  (ops) ")
    assert key.comment == "beta node  (ops)"


def test_keys_are_equal_by_blob_not_comment() -> None:
    a = parse_public_key(EXAMPLE_LINE)
    b = parse_public_key(EXAMPLE_LINE.replace("wim@localhost", "someone-else"))
    other = SSHPrivateKey.from_cryptography(Ed25519PrivateKey.generate()).public_key
    assert a == b
    assert hash(a) == hash(b)
    assert a != other
    assert len({a, b, other}) == 2
    assert "SHA256:psM4rr0Rhr" in repr(a)


def _key_of(kind: str) -> SSHPrivateKey:
    if kind == "ed25519":
        return SSHPrivateKey.from_cryptography(Ed25519PrivateKey.generate())
    return SSHPrivateKey.from_cryptography(ec.generate_private_key(ec.SECP256R1()))


@pytest.mark.parametrize("kind", ["ed25519", "ecdsa"])
def test_one_key_in_its_plain_and_security_key_forms_has_one_identity(kind: str) -> None:
    plain = _key_of(kind).public_key
    sk_one = parse_public_key(sk_form(plain.to_line(), "ssh:"))
    sk_two = parse_public_key(sk_form(plain.to_line(), "ssh:other", comment="laptop"))
    # Three keys as SSH sees them (blobs, fingerprints, equality), one key by its material.
    assert len({plain.blob, sk_one.blob, sk_two.blob}) == 3
    assert len({plain.fingerprint, sk_one.fingerprint, sk_two.fingerprint}) == 3
    assert plain != sk_one
    assert plain.identity == sk_one.identity == sk_two.identity


def test_identities_of_different_keys_differ_and_ignore_comments() -> None:
    keys = [_key_of(kind).public_key for kind in ("ed25519", "ed25519", "ecdsa", "ecdsa")]
    keys.append(SSHPrivateKey.from_cryptography(rsa.generate_private_key(65537, 2048)).public_key)
    assert len({key.identity for key in keys}) == len(keys)
    assert parse_public_key(keys[0].to_line("a")).identity == parse_public_key(keys[0].to_line("b")).identity


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("", r"^the SSH public key line is empty\.$"),
        ("   \n", r"^the SSH public key line is empty\.$"),
        ("ssh-ed25519", r"^the SSH public key line has no key data after 'ssh-ed25519'"),
        ("ssh-ed25519 AAAA*AAA", r"^the SSH public key's base64 data is not valid\.$"),
        ("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAo3D7CG", r"^the public key is truncated: its Ed25519 key"),
        (
            "ssh-rsa " + EXAMPLE_LINE.split()[1],
            r"^the key line says 'ssh-rsa' but its data holds a 'ssh-ed25519' key\.$",
        ),
        ('restrict,command="x" ' + EXAMPLE_LINE, r"^options before the key type \(authorized_keys options\)"),
        ("no-touch-required " + EXAMPLE_LINE, r"options before the key type"),
        ("ssh-ed25519 " + "A" * 20000, r"longer than 16384 characters"),
    ],
)
def test_malformed_lines_are_refused(line: str, message: str) -> None:
    with pytest.raises(SignatureError, match=message):
        parse_public_key(line)


def test_non_text_line_is_refused() -> None:
    with pytest.raises(SignatureError, match=r"^an SSH public key line must be text, not bytes\.$"):
        parse_public_key(EXAMPLE_LINE.encode())  # type: ignore[arg-type]


def test_trailing_bytes_in_key_blob_are_refused() -> None:
    blob = base64.b64decode(EXAMPLE_LINE.split()[1]) + b"\x00\x00"
    with pytest.raises(SignatureError, match=r"^the public key has 2 unexpected trailing bytes\.$"):
        parse_public_key(line_for(blob))


def test_truncated_key_blob_is_refused() -> None:
    blob = base64.b64decode(EXAMPLE_LINE.split()[1])[:-1]
    with pytest.raises(
        SignatureError, match=r"^the public key is truncated: its Ed25519 key claims 32 bytes"
    ):
        public_key_from_blob(blob)


def test_ed25519_key_of_wrong_length_is_refused() -> None:
    blob = ssh_string(b"ssh-ed25519") + ssh_string(b"\x01" * 31)
    with pytest.raises(SignatureError, match=r"^the Ed25519 public key is 31 bytes long instead of 32\.$"):
        public_key_from_blob(blob)


def test_dsa_certificates_and_unknown_types_are_refused() -> None:
    with pytest.raises(SignatureError, match=r"^DSA keys \(ssh-dss\) are refused; use an ed25519 key\.$"):
        public_key_from_blob(ssh_string(b"ssh-dss") + ssh_string(b"\x01"))
    with pytest.raises(
        SignatureError, match=r"^SSH certificates are not accepted; use the plain public key\.$"
    ):
        public_key_from_blob(ssh_string(b"ssh-ed25519-cert-v01@openssh.com") + ssh_string(b"nonce"))
    with pytest.raises(SignatureError, match=r"^unsupported SSH key type 'ssh-ed448'\.$"):
        public_key_from_blob(ssh_string(b"ssh-ed448") + ssh_string(b"\x01" * 57))
    with pytest.raises(SignatureError, match=r"^unsupported SSH key type '\\n\\x1b\[2J'\.$"):
        public_key_from_blob(ssh_string(b"\n\x1b[2J"))


def test_rsa_below_2048_bits_is_refused() -> None:
    small = rsa.generate_private_key(public_exponent=65537, key_size=1024)  # noqa: S505 - refused on purpose
    numbers = small.public_key().public_numbers()
    blob = ssh_string(b"ssh-rsa") + ssh_mpint(numbers.e) + ssh_mpint(numbers.n)
    with pytest.raises(
        SignatureError, match=r"^RSA keys of 1024 bits are refused: at least 2048 bits are required\.$"
    ):
        public_key_from_blob(blob)
    with pytest.raises(SignatureError, match="RSA keys of 1024 bits are refused"):
        SSHPrivateKey.from_cryptography(small)


def test_rsa_at_2048_bits_is_accepted_and_2047_refused() -> None:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    numbers = key.public_key().public_numbers()
    blob = ssh_string(b"ssh-rsa") + ssh_mpint(numbers.e) + ssh_mpint(numbers.n)
    assert public_key_from_blob(blob).bits == 2048
    smaller = numbers.n >> 1 | 1  # 2047 bits, odd
    with pytest.raises(SignatureError, match="RSA keys of 2047 bits are refused"):
        public_key_from_blob(ssh_string(b"ssh-rsa") + ssh_mpint(numbers.e) + ssh_mpint(smaller))


def test_rsa_mpints_must_be_minimal_and_positive() -> None:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    numbers = key.public_key().public_numbers()
    padded_e = ssh_string(b"\x00" + numbers.e.to_bytes(3, "big"))
    with pytest.raises(SignatureError, match=r"^the public key's RSA exponent is not minimally encoded\.$"):
        public_key_from_blob(ssh_string(b"ssh-rsa") + padded_e + ssh_mpint(numbers.n))
    negative_n = ssh_string(numbers.n.to_bytes(256, "big"))  # high bit set without the zero byte
    with pytest.raises(SignatureError, match=r"^the public key's RSA modulus is a negative number\.$"):
        public_key_from_blob(ssh_string(b"ssh-rsa") + ssh_mpint(numbers.e) + negative_n)


def test_rsa_with_even_exponent_is_refused() -> None:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    n = key.public_key().public_numbers().n
    with pytest.raises(SignatureError, match=r"^the RSA public key is not valid"):
        public_key_from_blob(ssh_string(b"ssh-rsa") + ssh_mpint(65536) + ssh_mpint(n))


@pytest.mark.parametrize(
    ("curve", "name", "bits"),
    [(ec.SECP256R1(), "nistp256", 256), (ec.SECP384R1(), "nistp384", 384), (ec.SECP521R1(), "nistp521", 521)],
)
def test_ecdsa_keys_parse_with_their_sizes(curve: ec.EllipticCurve, name: str, bits: int) -> None:
    key = SSHPrivateKey.from_cryptography(ec.generate_private_key(curve)).public_key
    assert key.key_type == f"ecdsa-sha2-{name}"
    assert key.bits == bits
    assert parse_public_key(key.to_line()) == key


def test_ecdsa_compressed_wrong_curve_and_off_curve_points_are_refused() -> None:
    private = ec.generate_private_key(ec.SECP256R1())
    compressed = private.public_key().public_bytes(
        serialization.Encoding.X962, serialization.PublicFormat.CompressedPoint
    )
    head = ssh_string(b"ecdsa-sha2-nistp256") + ssh_string(b"nistp256")
    with pytest.raises(SignatureError, match=r"curve point is not an uncompressed nistp256 point\.$"):
        public_key_from_blob(head + ssh_string(compressed))
    with pytest.raises(SignatureError, match=r"^the ecdsa-sha2-nistp256 key names curve 'nistp384'"):
        public_key_from_blob(
            ssh_string(b"ecdsa-sha2-nistp256") + ssh_string(b"nistp384") + ssh_string(b"\x04")
        )
    off_curve = b"\x04" + b"\x01" * 64
    with pytest.raises(
        SignatureError, match=r"^the ecdsa-sha2-nistp256 key's curve point is not on the curve\.$"
    ):
        public_key_from_blob(head + ssh_string(off_curve))


def test_security_key_types_parse() -> None:
    raw = Ed25519PrivateKey.generate().public_key().public_bytes_raw()
    blob = ssh_string(b"sk-ssh-ed25519@openssh.com") + ssh_string(raw) + ssh_string(b"ssh:")
    key = parse_public_key(line_for(blob) + " token")
    assert key.is_security_key
    assert key.application == "ssh:"
    assert key.comment == "token"
    assert not parse_public_key(EXAMPLE_LINE).is_security_key


# --- private keys ------------------------------------------------------------------------------------


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    path.chmod(0o600)
    return path


def test_openssh_format_key_loads_and_signs(tmp_path: Path) -> None:
    private = Ed25519PrivateKey.generate()
    path = _write(
        tmp_path / "id",
        private.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
        ),
    )
    key = load_private_key(path)
    assert key.key_type == "ssh-ed25519"
    assert key.path == path
    assert isinstance(key, Signer)
    assert key.public_key.blob == SSHPrivateKey.from_cryptography(private).public_key.blob
    sshsig_verify(b"data", sshsig_sign(b"data", key, "file"), key.public_key, "file")
    assert key.public_key.comment == ""


def test_comment_comes_from_matching_pub_file(tmp_path: Path) -> None:
    private = Ed25519PrivateKey.generate()
    path = _write(
        tmp_path / "id",
        private.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
        ),
    )
    public = SSHPrivateKey.from_cryptography(private).public_key
    (tmp_path / "id.pub").write_text(public.to_line("beta@cluster") + "\n")
    assert load_private_key(path).public_key.comment == "beta@cluster"
    other = SSHPrivateKey.from_cryptography(Ed25519PrivateKey.generate()).public_key
    (tmp_path / "id.pub").write_text(other.to_line("not-this-key") + "\n")
    assert load_private_key(path).public_key.comment == ""


def test_pem_keys_load_with_and_without_passphrase(tmp_path: Path) -> None:
    private = ec.generate_private_key(ec.SECP384R1())
    plain = _write(
        tmp_path / "plain.pem",
        private.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ),
    )
    locked = _write(
        tmp_path / "locked.pem",
        private.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"s3cret"),
        ),
    )
    assert load_private_key(plain).key_type == "ecdsa-sha2-nistp384"
    assert load_private_key(locked, "s3cret").public_key == load_private_key(plain).public_key
    assert load_private_key(locked, b"s3cret").key_type == "ecdsa-sha2-nistp384"
    with pytest.raises(ConfigError, match=r"^the passphrase for the private key .*locked\.pem is wrong\.$"):
        load_private_key(locked, "wrong")
    with pytest.raises(
        ConfigError,
        match=r"^the private key .*locked\.pem is protected by a passphrase, and none was given\.$",
    ):
        load_private_key(locked)


@pytest.mark.parametrize("form", ["pkcs8", "traditional", "openssh"])
def test_a_wrong_passphrase_is_named_even_when_the_library_reports_a_parse_error(
    tmp_path: Path, form: str
) -> None:
    """About one wrong passphrase in 256 leaves valid CBC padding, and ``cryptography`` then reports
    an ASN.1 parse error instead of a bad decryption; the sentence must still say the passphrase is
    wrong (this flaked in CI once the test above drew such a passphrase)."""
    private = ec.generate_private_key(ec.SECP256R1())
    formats = {
        "pkcs8": serialization.PrivateFormat.PKCS8,
        "traditional": serialization.PrivateFormat.TraditionalOpenSSL,
        "openssh": serialization.PrivateFormat.OpenSSH,
    }
    data = private.private_bytes(
        serialization.Encoding.PEM, formats[form], serialization.BestAvailableEncryption(b"s3cret")
    )
    path = _write(tmp_path / "locked", data)
    load = serialization.load_ssh_private_key if form == "openssh" else serialization.load_pem_private_key
    wrong = ["wrong"]
    if form != "openssh":  # bcrypt-KDF files fail by checksum, without a padding lottery to search
        for i in range(20_000):
            try:
                load(data, f"wrong{i}".encode())
            except ValueError as exc:
                if "decrypt" not in str(exc).lower():
                    wrong.append(f"wrong{i}")
                    break
        else:
            pytest.fail("no passphrase among 20,000 left valid padding (chance about 1e-34)")
    for passphrase in wrong:
        with pytest.raises(ConfigError, match=r"^the passphrase for the private key .*locked is wrong\.$"):
            load_private_key(path, passphrase)
    assert load_private_key(path, "s3cret").key_type == "ecdsa-sha2-nistp256"


def test_passphrase_given_for_unprotected_key_is_ignored(tmp_path: Path) -> None:
    private = Ed25519PrivateKey.generate()
    path = _write(
        tmp_path / "id",
        private.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
        ),
    )
    assert load_private_key(path, "unused").key_type == "ssh-ed25519"


def test_missing_unreadable_and_garbage_files_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^the private key file .*nope does not exist\.$"):
        load_private_key(tmp_path / "nope")
    with pytest.raises(ConfigError, match=r"^cannot read the private key file .*: Is a directory\.$"):
        load_private_key(tmp_path)
    garbage = _write(tmp_path / "garbage", b"hello, I am not a key\n")
    with pytest.raises(ConfigError, match=r"^the file .*garbage is not a usable private key"):
        load_private_key(garbage)
    huge = _write(tmp_path / "huge", b"x" * (64 * 1024 + 1))
    with pytest.raises(ConfigError, match=r"is larger than 65536 bytes\.$"):
        load_private_key(huge)


def test_refused_private_key_types(tmp_path: Path) -> None:
    small = _write(
        tmp_path / "rsa1024",
        rsa.generate_private_key(public_exponent=65537, key_size=1024).private_bytes(  # noqa: S505
            serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
        ),
    )
    with pytest.raises(
        ConfigError, match=r"refused: RSA keys of 1024 bits are refused: at least 2048 bits are required\.$"
    ):
        load_private_key(small)
    dsa_key = _write(
        tmp_path / "dsa",
        dsa.generate_private_key(key_size=1024).private_bytes(  # noqa: S505
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ),
    )
    with pytest.raises(ConfigError, match=r"is a DSAPrivateKey, which is not supported\.$"):
        load_private_key(dsa_key)
    ed448 = _write(
        tmp_path / "ed448",
        Ed448PrivateKey.generate().private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ),
    )
    with pytest.raises(ConfigError, match=r"is a Ed448PrivateKey, which is not supported\.$"):
        load_private_key(ed448)


def test_security_key_private_file_points_to_the_agent(tmp_path: Path) -> None:
    # The public part of an openssh-key-v1 file is in clear; a FIDO key there cannot sign here.
    raw = Ed25519PrivateKey.generate().public_key().public_bytes_raw()
    public = ssh_string(b"sk-ssh-ed25519@openssh.com") + ssh_string(raw) + ssh_string(b"ssh:")
    body = b"openssh-key-v1\x00" + ssh_string(b"none") + ssh_string(b"none") + ssh_string(b"")
    body += struct.pack(">I", 1) + ssh_string(public) + ssh_string(b"\x00" * 16)
    text = base64.encodebytes(body).replace(b"\n", b"")
    armored = b"-----BEGIN OPENSSH PRIVATE KEY-----\n" + text + b"\n-----END OPENSSH PRIVATE KEY-----\n"
    path = _write(tmp_path / "id_sk", armored)
    with pytest.raises(
        ConfigError, match=r"is a security key whose secret stays on the token; add it to ssh-agent"
    ):
        load_private_key(path)


def test_from_cryptography_refuses_other_key_kinds() -> None:
    with pytest.raises(SignatureError, match=r"^Ed448PrivateKey keys are not supported for signing\.$"):
        SSHPrivateKey.from_cryptography(Ed448PrivateKey.generate())  # type: ignore[arg-type]


def test_private_key_repr_shows_no_secret() -> None:
    private = Ed25519PrivateKey.generate()
    key = SSHPrivateKey.from_cryptography(private)
    secret = private.private_bytes_raw()
    assert secret.hex() not in repr(key)
    assert base64.b64encode(secret).decode() not in repr(key)
    assert repr(key).startswith("SSHPrivateKey('ssh-ed25519', 'SHA256:")


def test_agent_signer_without_socket_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    with pytest.raises(
        SignatureError, match=r"^SSH_AUTH_SOCK is not set, so there is no ssh-agent to sign with\.$"
    ):
        AgentSigner(EXAMPLE_LINE)


def test_agent_signer_with_dead_socket_is_refused(tmp_path: Path) -> None:
    signer = AgentSigner(EXAMPLE_LINE, tmp_path / "no-agent.sock")
    assert signer.public_key == parse_public_key(EXAMPLE_LINE)
    with pytest.raises(
        SignatureError, match=r"^cannot reach the ssh-agent at .*no-agent\.sock: No such file"
    ):
        signer.sign(b"data")


def test_fingerprint_accepts_signers() -> None:
    key = SSHPrivateKey.from_cryptography(Ed25519PrivateKey.generate())
    assert fingerprint(key) == key.public_key.fingerprint
    assert isinstance(key.public_key, SSHPublicKey)
    assert signature_to_wire(sshsig_sign(b"x", key, "n")).startswith("U1NIU0lH")  # base64 of "SSHSIG"


# --- the benchmark entry point ------------------------------------------------------------------------


@pytest.mark.slow
def test_bench_signing_primitives_reports_every_rate() -> None:
    from teaagent_bench.signing import bench_signing_primitives

    result = bench_signing_primitives(0.2)
    assert set(result) >= {"sshsig_verify_per_s", "raw_verify_per_s", "ssh_keygen_verify_per_s"}
    assert all(value > 0 for value in result.values())
    assert result["sshsig_verify_ratio"] == pytest.approx(
        result["sshsig_verify_per_s"] / result["raw_verify_per_s"]
    )


def test_bench_needs_a_positive_budget() -> None:
    from teaagent_bench.signing import bench_signing_primitives

    with pytest.raises(ValueError, match="positive number of seconds"):
        bench_signing_primitives(0)
