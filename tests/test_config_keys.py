"""teaagent.config's keys: the node's own, its peers' (several, allowed signers files), its operators'."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from config_support import EXAMPLE, LINES, RSA_LINES, load
from config_support import fixture_node_dir as fixture_node_dir  # the fixture
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from key_forms import sk_form

from teaagent.config import load_config
from teaagent.errors import ConfigError
from teaagent.signing import SSHPrivateKey

# --- keys that need ssh-keygen ------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_public_key_of_a_passphrase_protected_key_needs_no_passphrase(
    ssh_key_factory: Callable[..., Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = ssh_key_factory("alpha", passphrase="correct horse")
    (tmp_path / "alpha.toml").write_text(
        f'agent_id = "alpha"\nprivate_key = "{key.private_path}"\nrelay_url = "http://127.0.0.1:8701"\n'
    )
    config = load_config(tmp_path / "alpha.toml")
    assert config.own_public_key().to_line() == " ".join(key.public_line.split()[:2])
    monkeypatch.setenv("TEAAGENT_KEY_PASSPHRASE", "correct horse")
    assert config.signer().public_key == config.own_public_key()


# -- keys of a peer, operators' keys, notifications (PROTOCOL.md "Keys of a peer") ------------------


_MORE = {name: Ed25519PrivateKey.generate() for name in ("op1", "op2", "op3")}
OPS = {name: SSHPrivateKey.from_cryptography(key).public_key.to_line() for name, key in _MORE.items()}


def test_a_peer_may_list_several_keys_and_an_allowed_signers_file(node_dir: Path) -> None:
    (node_dir / "beta.allowed_signers").write_text(
        "# beta's operators\n"
        f'beta,gamma namespaces="teaagent-approval" {OPS["op1"]} op1@laptop\n'
        f'beta valid-after="20260101",valid-before="20300101Z" {OPS["op2"]}\n'
        f"someone-else {OPS['op3']}\n"
    )
    text = EXAMPLE.replace(
        f'public_key = "{LINES["beta"]}"\n',
        f'public_key = "{LINES["beta"]}"\npublic_keys = ["{OPS["op3"]}"]\n'
        'allowed_signers = "beta.allowed_signers"\n',
    )
    config = load(text)
    keys = config.peers["beta"].keys
    assert [key.line for key in keys] == [LINES["beta"], OPS["op3"], OPS["op1"] + " op1@laptop", OPS["op2"]]
    assert keys[2].namespaces == frozenset({"teaagent-approval"})
    assert keys[2].source == "beta.allowed_signers:2"
    assert keys[3].valid_before == 1893456000  # 2030-01-01 UTC ("Z")
    assert keys[3].valid_after is not None
    assert config.peers["beta"].public_key == LINES["beta"]
    assert config.quorum.keys_of("beta") == keys
    assert config.quorum.keys_of("gamma") == (config.peers["gamma"].keys[0],)


def test_a_peers_rsa_key_under_two_exponents_is_one_key(node_dir: Path) -> None:
    text = EXAMPLE.replace(
        f'public_key = "{LINES["beta"]}"\n',
        f'public_key = "{RSA_LINES[0]}"\npublic_keys = ["{RSA_LINES[1]}"]\n',
    )
    config = load(text)
    assert [key.line for key in config.peers["beta"].keys] == [RSA_LINES[0]]
    assert config.quorum.keys_of("beta") == config.peers["beta"].keys


def test_operators_and_notify_are_read(node_dir: Path) -> None:
    (node_dir / "operators.allowed_signers").write_text(f"alpha {OPS['op1']}\nbeta {OPS['op2']}\n")
    text = EXAMPLE.replace(
        "[approver]\nport = 8703\n",
        '[approver]\nport = 8703\noperators = "operators.allowed_signers"\n'
        'notify = { webhook_url = "https://hooks.example/services/T0/B0/secret", format = "slack" }\n',
    )
    config = load(text)
    assert [key.line for key in config.approver.operator_keys] == [OPS["op1"]]
    assert config.approver.operators == node_dir / "operators.allowed_signers"
    assert [key.line for key in config.own_keys()] == [LINES["alpha"], OPS["op1"]]
    assert config.approver.notify is not None
    assert config.approver.notify.format == "slack"
    assert "secret" not in repr(config.approver)


def _with_allowed_signers(node_dir: Path, body: str, peer: str = "beta") -> str:
    (node_dir / f"{peer}.allowed_signers").write_text(body)
    old = f'public_key = "{LINES[peer]}"\n'
    return EXAMPLE.replace(old, old + f'allowed_signers = "{peer}.allowed_signers"\n')


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            f"beta cert-authority {LINES['gamma']}\n",
            "alpha.toml: peers.beta.allowed_signers: beta.allowed_signers:1: cert-authority lines are "
            "refused: certificates are not supported in teaagent's protocol version 1; list the "
            "operators' own keys instead.",
        ),
        (
            f'beta namespaces="teaagent-approval",verify-required {OPS["op1"]}\n',
            "alpha.toml: peers.beta.allowed_signers: beta.allowed_signers:1: unknown option "
            "'verify-required' (known: cert-authority, namespaces, valid-after, valid-before).",
        ),
        (
            f'beta valid-before="2030-01-01" {OPS["op1"]}\n',
            "alpha.toml: peers.beta.allowed_signers: beta.allowed_signers:1: the time '2030-01-01' is not "
            "YYYYMMDD, YYYYMMDDHHMM or YYYYMMDDHHMMSS.",
        ),
        (
            "beta ssh-ed25519\n",
            "alpha.toml: peers.beta.allowed_signers: beta.allowed_signers:1: a line needs ",
        ),
        (
            f"gamma {OPS['op1']}\n",
            "alpha.toml: peers.beta.allowed_signers names beta.allowed_signers, which lists no key for beta.",
        ),
        (
            f"beta {LINES['gamma']}\n",
            "alpha.toml: beta.allowed_signers:1 and peers.gamma.public_key are the same key, which would "
            "count twice.",
        ),
        (
            f"beta {sk_form(LINES['alpha'])}\n",
            "alpha.toml: beta.allowed_signers:1 is this node's own key, which would count this node as "
            "a peer.",
        ),
    ],
    ids=["cert-authority", "unknown option", "bad time", "no key", "nobody", "shared", "own key as sk"],
)
def test_a_bad_allowed_signers_file_is_one_sentence(node_dir: Path, body: str, message: str) -> None:
    text = _with_allowed_signers(node_dir, body)
    with pytest.raises(ConfigError, match="^" + re.escape(message)):
        load(text)


def test_a_public_key_file_as_private_key_says_to_name_the_private_one(node_dir: Path) -> None:
    (node_dir / "keys" / "alpha.pub").write_text(LINES["alpha"] + "\n")
    with pytest.raises(
        ConfigError,
        match="^"
        + re.escape(
            "alpha.toml: private_key keys/alpha.pub is the public half of the key; "
            "name the private key file (the one without .pub)."
        )
        + "$",
    ):
        load(EXAMPLE.replace('"keys/alpha"', '"keys/alpha.pub"'))


def test_a_missing_allowed_signers_file_says_where_it_looked(node_dir: Path) -> None:
    text = EXAMPLE.replace(
        f'public_key = "{LINES["beta"]}"\n', f'public_key = "{LINES["beta"]}"\nallowed_signers = "nope"\n'
    )
    with pytest.raises(
        ConfigError,
        match="^" + re.escape("alpha.toml: peers.beta.allowed_signers names nope, which does not exist"),
    ):
        load(text)


def test_an_operator_key_listed_for_a_peer_is_refused(node_dir: Path) -> None:
    (node_dir / "operators.allowed_signers").write_text(f"alpha {OPS['op1']}\n")
    text = _with_allowed_signers(node_dir, f"beta {OPS['op1']}\n").replace(
        "[approver]\nport = 8703\n", '[approver]\nport = 8703\noperators = "operators.allowed_signers"\n'
    )
    with pytest.raises(
        ConfigError,
        match="^"
        + re.escape(
            "alpha.toml: beta.allowed_signers:1 is the key of this node's operator "
            "(operators.allowed_signers:1), which would count this node as a peer."
        ),
    ):
        load(text)


def test_a_notify_table_is_checked(node_dir: Path) -> None:
    text = EXAMPLE.replace(
        "[approver]\nport = 8703\n", '[approver]\nport = 8703\nnotify = { webhook_url = "x" }\n'
    )
    with pytest.raises(
        ConfigError,
        match="^" + re.escape("alpha.toml: approver.notify.webhook_url must be an http:// or https:// URL"),
    ):
        load(text)
    text = EXAMPLE.replace(
        "[approver]\nport = 8703\n",
        '[approver]\nport = 8703\nnotify = { webhook_url = "https://x.example", format = "xml" }\n',
    )
    with pytest.raises(
        ConfigError,
        match="^" + re.escape("""alpha.toml: approver.notify.format must be "slack" or "json", not 'xml'."""),
    ):
        load(text)
