"""SSH keys and SSHSIG signatures, exactly as OpenSSH's ``ssh-keygen -Y sign`` / ``-Y verify``.

The binary SSHSIG (OpenSSH ``PROTOCOL.sshsig``; every integer big-endian, a ``string`` is a uint32
length and that many bytes)::

    byte[6] "SSHSIG" | uint32 1 | string public key | string namespace | string reserved ("")
    | string hash algorithm ("sha512" or "sha256") | string signature

and the bytes the key actually signs::

    byte[6] "SSHSIG" | string namespace | string reserved ("") | string hash algorithm | string H(data)

Armored it sits between ``-----BEGIN SSH SIGNATURE-----`` and ``-----END SSH SIGNATURE-----`` in
70-character base64 lines; on the teaagent wire it is the bare base64 of the blob, one line, padded.
Details, and the verification steps, are in :mod:`teaagent.signing._sshsig`.

Typical use::

    key = load_private_key("keys/beta")
    sig = sshsig_sign(statement_bytes, key, "teaagent-approval")       # armored, like ssh-keygen
    wire = signature_to_wire(sig)                                       # what travels in JSON
    sshsig_verify(statement_bytes, wire, parse_public_key(line), "teaagent-approval")  # or raises

Keys: ``ssh-ed25519``, ``ecdsa-sha2-nistp256/384/521``, ``ssh-rsa`` of 2048 bits or more (signatures
``rsa-sha2-256``/``rsa-sha2-512`` only), and, for verification, the security-key types
``sk-ssh-ed25519@openssh.com`` and ``sk-ecdsa-sha2-nistp256@openssh.com`` with user presence required.
"""

from __future__ import annotations

from teaagent.errors import SignatureError
from teaagent.signing._agent import AgentSigner, agent_identities
from teaagent.signing._keys import (
    MIN_RSA_BITS,
    SUPPORTED_KEY_TYPES,
    Signer,
    SSHPublicKey,
    fingerprint,
    parse_public_key,
    public_key_from_blob,
)
from teaagent.signing._private import SSHPrivateKey, load_private_key
from teaagent.signing._sshsig import (
    HASH_ALGORITHMS,
    SIGNING_HASH,
    SSHSig,
    armor,
    parse_sshsig,
    signature_to_wire,
    sshsig_sign,
    sshsig_verify,
)

__all__ = [
    "HASH_ALGORITHMS",
    "MIN_RSA_BITS",
    "SIGNING_HASH",
    "SUPPORTED_KEY_TYPES",
    "AgentSigner",
    "SSHPrivateKey",
    "SSHPublicKey",
    "SSHSig",
    "SignatureError",
    "Signer",
    "agent_identities",
    "armor",
    "fingerprint",
    "load_private_key",
    "parse_public_key",
    "parse_sshsig",
    "public_key_from_blob",
    "signature_to_wire",
    "sshsig_sign",
    "sshsig_verify",
]
