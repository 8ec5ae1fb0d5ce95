"""A peer's relay checks the origin's requests and withdrawals with all the origin's keys (PROTOCOL.md
"Keys of the origin"), each with its ``allowed_signers`` namespaces and validity: a rotated origin
keeps working, a retired key originates nothing new, and an approve-only key originates nothing.

beta's relay is served on a real socket (uvicorn in a thread of this process) over the test's
Redis; alpha is only a signer here. beta knows alpha from an ``allowed_signers`` file alone.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from relay_support import Node, error, public_line, served, signer, write_cluster

from teaagent.quorum import sign_request, sign_withdrawal

RETIRED_AT = int(time.time()) - 86_400  # alpha's first key was retired a day ago


def exactly(message: str) -> str:
    return f"^{re.escape(message)}$"


def cluster(tmp_path: Path, redis_url: str, redis_prefix: str, alpha_keys: str) -> dict[str, Node]:
    """alpha asks beta (1 of 1); beta's ``[peers.alpha]`` lists alpha's keys in ``alpha.keys`` only."""
    nodes = write_cluster(
        tmp_path,
        ["alpha", "beta"],
        redis_url=redis_url,
        prefix=redis_prefix,
        required=1,
        peers_of={"alpha": ["beta"], "beta": ["alpha"]},
    )
    (tmp_path / "alpha.keys").write_text(alpha_keys)
    config = nodes["beta"].config_path
    node_key = f'public_key = "{public_line("alpha")}"\n'
    assert node_key in config.read_text()
    config.write_text(config.read_text().replace(node_key, 'allowed_signers = "alpha.keys"\n'))
    return nodes


def signed_by(request: dict[str, Any], key_name: str) -> dict[str, Any]:
    return {"request": request, "signature": sign_request(request, signer(key_name))}


def withdrawal_path(request: dict[str, Any]) -> str:
    return f"/v1/inbox/{request['request_id']}/withdrawal"


@pytest.fixture
def rotated(tmp_path: Path, redis_url: str, redis_prefix: str) -> dict[str, Node]:
    """alpha rotated its node key: the first key is retired (valid-before a day ago), alpha-2 is current."""
    retired = time.strftime("%Y%m%d%H%M%S", time.gmtime(RETIRED_AT))
    return cluster(
        tmp_path,
        redis_url,
        redis_prefix,
        f'alpha valid-before="{retired}Z" {public_line("alpha")} retired\n'
        f"alpha {public_line('alpha-2')} current\n",
    )


@pytest.mark.slow
def test_a_peers_relay_refuses_a_retired_key_and_accepts_the_rotated_one(rotated: dict[str, Node]) -> None:
    alpha, beta = rotated["alpha"], rotated["beta"]
    old, new = alpha.request(call_id="old"), alpha.request(call_id="new")
    retired = signer("alpha").public_key.fingerprint
    until = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(RETIRED_AT))
    with served(beta, deliver=False), httpx.Client(base_url=beta.url, timeout=20) as client:
        refused = client.post("/v1/inbox", json=signed_by(old, "alpha"))
        accepted = client.post("/v1/inbox", json=signed_by(new, "alpha-2"))
        # The withdrawals of the request in the inbox: the same two keys, the same answers.
        late = client.post(withdrawal_path(new), json=sign_withdrawal(new, signer("alpha")))
        withdrawn = client.post(withdrawal_path(new), json=sign_withdrawal(new, signer("alpha-2")))
    assert error(refused) == (
        403,
        "bad_signature",
        "The request signature does not verify with the keys configured for alpha: "
        f"the key {retired} was valid only until {until}.",
    )
    assert (accepted.status_code, accepted.json()["state"]) == (201, "pending")
    assert error(late) == (
        403,
        "bad_signature",
        f"The withdrawal does not verify with the keys configured for alpha: the key {retired} was "
        f"valid only until {until}.",
    )
    assert (withdrawn.status_code, withdrawn.json()["state"]) == (200, "withdrawn")


@pytest.fixture
def staffed(tmp_path: Path, redis_url: str, redis_prefix: str) -> dict[str, Node]:
    """alpha's operator key, listed first, may only approve and deny; alpha's node key comes second."""
    return cluster(
        tmp_path,
        redis_url,
        redis_prefix,
        f'alpha namespaces="teaagent-approval,teaagent-denial" {public_line("alpha-ops")} ana\n'
        f"alpha {public_line('alpha')} node\n",
    )


@pytest.mark.slow
def test_an_approve_only_key_originates_neither_a_request_nor_a_withdrawal(staffed: dict[str, Node]) -> None:
    alpha, beta = staffed["alpha"], staffed["beta"]
    forged, genuine = alpha.request(call_id="ops"), alpha.request(call_id="node")
    operator = signer("alpha-ops").public_key.fingerprint
    with served(beta, deliver=False), httpx.Client(base_url=beta.url, timeout=20) as client:
        by_operator = client.post("/v1/inbox", json=signed_by(forged, "alpha-ops"))
        by_node = client.post("/v1/inbox", json=signed_by(genuine, "alpha"))
        by_operator_key = sign_withdrawal(genuine, signer("alpha-ops"))
        withdrawn_by_operator = client.post(withdrawal_path(genuine), json=by_operator_key)
        listed = client.get("/v1/inbox", params={"state": "all"}, headers=beta.headers)
        withdrawn_by_node = client.post(
            withdrawal_path(genuine), json=sign_withdrawal(genuine, signer("alpha"))
        )
    assert error(by_operator) == (
        403,
        "bad_signature",
        "The request signature does not verify with the keys configured for alpha: the key "
        f"{operator} may sign only in teaagent-approval, teaagent-denial, not in teaagent-request.",
    )
    assert (by_node.status_code, by_node.json()["state"]) == (201, "pending")
    assert error(withdrawn_by_operator) == (
        403,
        "bad_signature",
        "The withdrawal does not verify with the keys configured for alpha: the key "
        f"{operator} may sign only in teaagent-approval, teaagent-denial, not in teaagent-withdrawal.",
    )
    assert [(item["request_id"], item["state"]) for item in listed.json()] == [
        (genuine["request_id"], "pending")
    ]
    assert (withdrawn_by_node.status_code, withdrawn_by_node.json()["state"]) == (200, "withdrawn")
