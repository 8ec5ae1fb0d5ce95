"""Other SSH forms of one key: the same key material written as a security-key (``sk-``) key, and
one RSA modulus with two public exponents.

Software holding an Ed25519 or P-256 private key can make valid ``sk-`` format signatures with it
(the flags and counter are just bytes it chooses), so PROTOCOL.md "Key identity" calls both forms
one key; an RSA private key signs under any exponent of its modulus ("RSA key identity"). The tests
use these lines to try to make one key count as two peers.
"""

from __future__ import annotations

import base64
import functools
import math

from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from teaagent.signing._wire import put_string

_SK_TYPES = {
    "ssh-ed25519": "sk-ssh-ed25519@openssh.com",
    "ecdsa-sha2-nistp256": "sk-ecdsa-sha2-nistp256@openssh.com",
}


def sk_form(line: str, application: str = "ssh:", comment: str = "") -> str:
    """Return ``line``'s key (ssh-ed25519 or ecdsa-sha2-nistp256) as its ``sk-`` form, same material."""
    key_type, encoded = line.split()[:2]
    blob = base64.b64decode(encoded)
    name_length = int.from_bytes(blob[:4], "big")
    material = blob[4 + name_length :]  # Ed25519: string key; ECDSA: string curve, string point
    sk_type = _SK_TYPES[key_type]
    sk_blob = put_string(sk_type.encode()) + material + put_string(application.encode())
    text = f"{sk_type} {base64.b64encode(sk_blob).decode()}"
    return f"{text} {comment}".strip()


@functools.cache
def rsa_exponent_forms() -> tuple[rsa.RSAPrivateKey, rsa.RSAPrivateKey]:
    """One RSA private key twice: with e = 65537, and with another exponent (3, 17 or 257), one modulus.

    Whoever knows the factors of n signs under any exponent prime to lcm(p-1, q-1), so PROTOCOL.md
    "RSA key identity" makes both one key. Made once per test process (2048 bits take a moment).
    """
    while True:
        usual = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        numbers = usual.private_numbers()
        p, q, n = numbers.p, numbers.q, numbers.public_numbers.n
        order = math.lcm(p - 1, q - 1)
        exponent = next((e for e in (3, 17, 257) if math.gcd(e, order) == 1), None)
        if exponent is None:
            continue  # all three divide into lcm(p-1, q-1): another key
        d = pow(exponent, -1, order)
        other = rsa.RSAPrivateNumbers(
            p, q, d, d % (p - 1), d % (q - 1), numbers.iqmp, rsa.RSAPublicNumbers(exponent, n)
        ).private_key()
        return usual, other


def rsa_line(key: rsa.RSAPrivateKey, comment: str = "") -> str:
    """The OpenSSH public key line of an RSA key (``ssh-rsa BASE64 [COMMENT]``)."""
    line = key.public_key().public_bytes(Encoding.OpenSSH, PublicFormat.OpenSSH).decode()
    return f"{line} {comment}".strip()
