"""Other SSH forms of one key: the same key material written as a security-key (``sk-``) key.

Software holding an Ed25519 or P-256 private key can make valid ``sk-`` format signatures with it
(the flags and counter are just bytes it chooses), so PROTOCOL.md "Key identity" calls both forms
one key. The tests use these lines to try to make one key count as two peers.
"""

from __future__ import annotations

import base64

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
