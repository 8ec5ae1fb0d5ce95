"""How much :func:`evaluate` costs beyond the cryptography it cannot avoid.

``teaagent bench quorum`` reports ``evaluate_2of3_over_two_raw``: the time of one ``evaluate`` of a
2-of-3 quorum with two valid Ed25519 approvals, divided by the time of two raw ``cryptography``
Ed25519 verifications, both measured in the same run so that the machine's speed cancels out.
The target is at most 2.5: request validation, statement rebuilding, SSHSIG parsing and hashing
together should cost less than the signatures themselves.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Final

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from teaagent.quorum import build_request, evaluate, sign_approval
from teaagent.signing import SSHPrivateKey
from teaagent.trust import MultiSigQuorumConfig

__all__ = ["TARGET_EVALUATE_2OF3_OVER_TWO_RAW", "bench_evaluate"]

TARGET_EVALUATE_2OF3_OVER_TWO_RAW: Final = 2.5  # counting around two verifications costs less than they do
_ROUNDS: Final = 7  # alternate the two measurements so that drift in machine load hits both alike
_PEERS: Final = ("beta", "gamma", "delta")


def _per_call(function: Callable[[], object], seconds: float) -> float:
    """Seconds per call of ``function``, over batches lasting about ``seconds`` in all."""
    calls = 0
    started = time.perf_counter()
    elapsed = 0.0
    batch = 16
    while elapsed < seconds or calls == 0:
        for _ in range(batch):
            function()
        calls += batch
        elapsed = time.perf_counter() - started
    return elapsed / calls


def bench_evaluate(seconds: float) -> dict[str, float]:
    """Measure one 2-of-3 ``evaluate`` against two raw Ed25519 verifications.

    Args:
        seconds: Roughly how long the measurement runs (setup aside).

    Returns:
        ``evaluate_2of3_over_two_raw`` (the ratio, target at most 2.5), ``evaluate_us`` (one
        evaluate, microseconds) and ``two_raw_verifies_us`` (two raw verifications, microseconds).
    """
    keys = {name: SSHPrivateKey.from_cryptography(Ed25519PrivateKey.generate()) for name in _PEERS}
    config = MultiSigQuorumConfig(
        enabled=True,
        required_approvals=2,
        peer_agent_ids=list(_PEERS),
        peer_public_keys={name: key.public_key.to_line() for name, key in keys.items()},
        peer_relay_urls={name: f"http://127.0.0.1:{8702 + index}" for index, name in enumerate(_PEERS)},
        high_risk_patterns=["shell.*"],
        timeout_seconds=120,
    )
    now = int(time.time())
    request = build_request(
        origin="alpha",
        run_id="bench-run",
        call_id="call-1",
        tool_name="shell.run",
        arguments={"command": "rm -rf build", "timeout": 30},
        reason="clean the build folder before a fresh build",
        config=config,
        now=now,
    )
    approvals = [sign_approval(request, name, keys[name], signed_at=now + 1) for name in ("beta", "gamma")]
    outcome = evaluate(request, approvals, [], config, now=now + 2)
    if outcome.state != "approved":  # pragma: no cover - a broken build, not a slow one
        raise RuntimeError(f"the benchmark's quorum was not approved: {outcome.rejected}")

    raw_keys = [Ed25519PrivateKey.generate() for _ in range(2)]
    message = bytes(range(128))  # about the size of SSHSIG's signed data: a prefix and a SHA-512
    raw = [(key.public_key(), key.sign(message)) for key in raw_keys]

    def one_evaluate() -> None:
        evaluate(request, approvals, [], config, now=now + 2)

    def two_raw_verifies() -> None:
        for public, signature in raw:
            public.verify(signature, message)

    share = max(seconds, 0.01) / (2 * _ROUNDS)
    evaluate_times: list[float] = []
    raw_times: list[float] = []
    for _ in range(_ROUNDS):
        evaluate_times.append(_per_call(one_evaluate, share))
        raw_times.append(_per_call(two_raw_verifies, share))
    # The minimum is the measurement least disturbed by other processes, for both sides alike.
    best_evaluate, best_raw = min(evaluate_times), min(raw_times)
    return {
        "evaluate_2of3_over_two_raw": best_evaluate / best_raw,
        "evaluate_us": best_evaluate * 1e6,
        "two_raw_verifies_us": best_raw * 1e6,
    }
