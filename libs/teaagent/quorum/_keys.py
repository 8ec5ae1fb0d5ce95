"""Which of a signer's keys made a signature, under the limits of its ``allowed_signers`` entries."""

from __future__ import annotations

from collections.abc import Sequence

from teaagent.errors import SignatureError
from teaagent.signing import parse_sshsig, sshsig_verify
from teaagent.trust import SignerKey

__all__ = ["keys_given", "signing_key"]


def keys_given(keys: Sequence[SignerKey] | str) -> Sequence[SignerKey]:
    """The keys as given, or a key line as one key without limits (a SignatureError when unusable)."""
    if not isinstance(keys, str):
        return keys
    try:
        return (SignerKey(line=keys, source="the origin's key"),)
    except ValueError as exc:
        raise SignatureError(str(exc)) from None


def signing_key(
    data: bytes, signature: str, keys: Sequence[SignerKey], namespace: str, signed_at: int, *, whose: str
) -> SignerKey:
    """Return which of a signer's ``keys`` made ``signature`` over ``data``, checking everything.

    PROTOCOL.md rules 2 and 3: the key embedded in the SSHSIG must be one of the signer's keys
    (an exact key, as ``ssh-keygen -Y verify`` compares them), allowed to sign in ``namespace``
    at ``signed_at`` by its ``allowed_signers`` options; then the SSHSIG is verified with it. A
    key listed several times (two ``allowed_signers`` lines with other namespaces or validity)
    may sign when any of its entries allows it, as ``ssh-keygen -Y verify`` reads every line.

    Args:
        data: The exact bytes that were signed.
        signature: The SSHSIG, bare base64 or armored.
        keys: The signer's keys, from the verifier's own configuration.
        namespace: The namespace the signature must carry.
        signed_at: The signing time the signed document claims.
        whose: The keys as a phrase for messages (``beta's configured key``).

    Returns:
        The key that signed.

    Raises:
        SignatureError: No key is configured, the signature is by another key, that key may not
            sign in ``namespace`` at ``signed_at``, or the signature does not verify (one sentence).
    """
    if not keys:
        raise SignatureError(f"no public key is configured as {whose}.")
    entries: Sequence[SignerKey] = keys
    if len(keys) > 1:
        embedded = parse_sshsig(signature).public_key_blob
        entries = [key for key in keys if key.key.blob == embedded]
        if not entries:
            made_by = parse_sshsig(signature).signer_fingerprint
            raise SignatureError(f"it was made by the key {made_by}, which is not one of {whose}.")
    chosen = next((key for key in entries if key.limit(namespace, signed_at) is None), None)
    if chosen is None:
        raise SignatureError(_refusal(entries, namespace, signed_at))
    sshsig_verify(data, signature, chosen.key, namespace)
    return chosen


def _refusal(entries: Sequence[SignerKey], namespace: str, signed_at: int) -> str:
    """One sentence: why no entry of one key may sign in ``namespace`` at ``signed_at``."""
    first = entries[0]
    if len(entries) == 1:
        return f"the key {first.fingerprint} {first.limit(namespace, signed_at)}."
    reasons = "; ".join(
        f"{f'at {entry.source}' if entry.source else f'in entry {number}'} it "
        f"{entry.limit(namespace, signed_at)}"
        for number, entry in enumerate(entries, 1)
    )
    return (
        f"the key {first.fingerprint} is listed {len(entries)} times and no entry allows this "
        f"signature: {reasons}."
    )
