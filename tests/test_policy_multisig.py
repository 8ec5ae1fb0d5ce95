"""teaagent.policy: MultiSigQuorumConfig's checks and PeerSignature.

The quorum step of the policy is in ``test_policy_quorum_step.py``.
"""

from __future__ import annotations

import base64
import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from key_forms import rsa_exponent_forms, rsa_line, sk_form
from multisig_support import KEYS, PEERS, URLS, config, exactly, public_line

from teaagent.policy import MAX_QUORUM_TIMEOUT_SECONDS, ApprovalPolicy, MultiSigQuorumConfig, PeerSignature

# -- MultiSigQuorumConfig ---------------------------------------------------------------------------


def test_a_valid_configuration() -> None:
    built = config()
    assert built.enabled
    assert built.describe_quorum() == "2 approvals from 3 peers"
    assert built.allow_dev_signatures is False


def test_disabled_factory() -> None:
    off = MultiSigQuorumConfig.disabled()
    assert off.enabled is False
    assert off.peer_agent_ids == []
    assert not off.is_high_risk("shell.run")


def test_enabled_has_no_default() -> None:
    with pytest.raises(TypeError):
        MultiSigQuorumConfig()  # type: ignore[call-arg]


def test_the_constructor_is_keyword_only() -> None:
    with pytest.raises(TypeError):
        MultiSigQuorumConfig(True, 1)  # type: ignore[misc]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"required_approvals": 0},
            "required_approvals must be at least 1 when multi-sig is enabled, not 0.",
        ),
        (
            {"required_approvals": -1},
            "required_approvals must be at least 1 when multi-sig is enabled, not -1.",
        ),
        ({"required_approvals": 4}, "required_approvals is 4 but only 3 peers are configured."),
        (
            {"peer_agent_ids": [], "peer_public_keys": {}, "peer_relay_urls": {}, "required_approvals": 1},
            "required_approvals is 1 but only 0 peers are configured.",
        ),
        ({"peer_agent_ids": ["beta", "delta", "beta"]}, "peer beta is listed twice in peer_agent_ids."),
        (
            {"peer_public_keys": {"beta": KEYS["beta"], "delta": KEYS["delta"]}},
            "peer gamma has no public key.",
        ),
        ({"peer_public_keys": {**KEYS, "gamma": "  "}}, "peer gamma has no public key."),
        ({"peer_relay_urls": {"beta": URLS["beta"], "gamma": URLS["gamma"]}}, "peer delta has no relay URL."),
        ({"peer_relay_urls": {**URLS, "delta": ""}}, "peer delta has no relay URL."),
        (
            {"peer_public_keys": {**KEYS, "zeta": public_line()}},
            "peer_public_keys names 'zeta', which is not in peer_agent_ids.",
        ),
        (
            {"peer_relay_urls": {**URLS, "zeta": "http://x"}},
            "peer_relay_urls names 'zeta', which is not in peer_agent_ids.",
        ),
        ({"high_risk_patterns": ["shell.*", ""]}, "high_risk_patterns holds an empty pattern."),
        ({"high_risk_patterns": [" "]}, "high_risk_patterns holds an empty pattern."),
        (
            {"high_risk_patterns": []},
            "multi-sig is enabled but high_risk_patterns is empty, so no call would need a quorum.",
        ),
        (
            {"timeout_seconds": 0},
            f"timeout_seconds must be between 1 and {MAX_QUORUM_TIMEOUT_SECONDS}, not 0.",
        ),
        (
            {"timeout_seconds": MAX_QUORUM_TIMEOUT_SECONDS + 1},
            f"timeout_seconds must be between 1 and {MAX_QUORUM_TIMEOUT_SECONDS}, "
            f"not {MAX_QUORUM_TIMEOUT_SECONDS + 1}.",
        ),
        (
            {"peer_relay_urls": {**URLS, "beta": "ftp://relay"}},
            "the relay URL 'ftp://relay' of beta is not an http or https URL.",
        ),
        (
            {"peer_relay_urls": {**URLS, "beta": "127.0.0.1:8702"}},
            "the relay URL '127.0.0.1:8702' of beta is not an http or https URL.",
        ),
        (  # urlsplit's own ValueError, in Python's words, would reach the user otherwise
            {"peer_relay_urls": {**URLS, "beta": "http://[::1"}},
            "the relay URL 'http://[::1' of beta is not an http or https URL.",
        ),
        (
            {"peer_relay_urls": {**URLS, "beta": "http://relay:99999"}},
            "the relay URL 'http://relay:99999' of beta is not an http or https URL.",
        ),
        (
            {"local_relay_base_url": "relay"},
            "the relay URL 'relay' of this node is not an http or https URL.",
        ),
    ],
)
def test_an_enabled_configuration_that_breaks_a_rule_is_refused(
    changes: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=exactly(message)):
        config(**changes)


def test_threshold_boundaries() -> None:
    assert config(required_approvals=1).required_approvals == 1
    assert config(required_approvals=3).required_approvals == 3


def test_timeout_boundaries() -> None:
    assert config(timeout_seconds=1).timeout_seconds == 1
    assert config(timeout_seconds=MAX_QUORUM_TIMEOUT_SECONDS).timeout_seconds == MAX_QUORUM_TIMEOUT_SECONDS


@pytest.mark.parametrize(
    ("peer", "valid"),
    [
        ("b", True),
        ("0", True),
        ("a" * 64, True),
        ("node-1.eu_west", True),
        ("a" * 65, False),
        ("", False),
        ("Beta", False),
        ("-beta", False),
        (".beta", False),
        ("be ta", False),
        ("beta\n", False),
        ("bêta", False),
    ],
)
def test_peer_ids_must_be_agent_ids(peer: str, valid: bool) -> None:
    changes = {
        "peer_agent_ids": [peer, "delta", "gamma"],
        "peer_public_keys": {peer: KEYS["beta"], "delta": KEYS["delta"], "gamma": KEYS["gamma"]},
        "peer_relay_urls": {peer: URLS["beta"], "delta": URLS["delta"], "gamma": URLS["gamma"]},
    }
    if valid:
        assert config(**changes).peer_agent_ids[0] == peer
    else:
        with pytest.raises(
            ValueError,
            match=exactly(
                f"peer id {peer!r} is not valid: use 1 to 64 lowercase letters, digits, '.', '_' or '-', "
                "starting with a letter or digit."
            ),
        ):
            config(**changes)


def test_two_peers_sharing_one_key_are_refused_whatever_the_comments() -> None:
    shared = public_line()
    keys = {
        **KEYS,
        "beta": f"{shared} beta@laptop",
        "gamma": f"{shared.split()[0]}   {shared.split()[1]}  other",
    }
    with pytest.raises(
        ValueError, match=exactly("peers beta and gamma share one public key, which would count twice.")
    ):
        config(peer_public_keys=keys)


@pytest.mark.parametrize("key_type", ["ed25519", "ecdsa"])
@pytest.mark.parametrize("forms", ["plain and sk", "two sk applications"])
def test_one_key_in_another_ssh_form_is_still_one_key(
    ssh_key_factory: Callable[..., Any], key_type: str, forms: str
) -> None:
    # Whoever holds the private key can sign in either form (an sk- signature's flags are bytes
    # it chooses), so the two lines would let one key satisfy 2 of 3 alone.
    line = ssh_key_factory("shared", key_type=key_type).public_line
    if forms == "plain and sk":
        beta, gamma = line, sk_form(line, comment="gamma")
    else:
        beta, gamma = sk_form(line, "ssh:"), sk_form(line, "ssh:teaagent")
    assert beta.split()[1] != gamma.split()[1]  # different blobs, one key
    with pytest.raises(
        ValueError, match=exactly("peers beta and gamma share one public key, which would count twice.")
    ):
        config(peer_public_keys={**KEYS, "beta": beta, "gamma": gamma})


def test_one_rsa_modulus_under_two_exponents_is_one_key() -> None:
    # Whoever factored n signs under e = 3 as well as under e = 65537: one key, one peer at most.
    usual, other = (rsa_line(key) for key in rsa_exponent_forms())
    assert usual.split()[1] != other.split()[1]  # different blobs, one modulus
    with pytest.raises(
        ValueError, match=exactly("peers beta and gamma share one public key, which would count twice.")
    ):
        config(peer_public_keys={**KEYS, "beta": usual, "gamma": other})


def test_distinct_keys_in_security_key_form_are_distinct_peers(ssh_key_factory: Callable[..., Any]) -> None:
    keys = {peer: sk_form(ssh_key_factory(f"sk-{peer}").public_line) for peer in PEERS}
    assert config(peer_public_keys=keys).peer_public_keys == keys


def test_a_key_that_parses_as_a_line_but_holds_no_usable_key_is_refused() -> None:
    short_rsa = (
        "ssh-rsa "
        + base64.b64encode(
            b"\x00\x00\x00\x07ssh-rsa" + b"\x00\x00\x00\x01\x03" + b"\x00\x00\x00\x02\x00\xc3"
        ).decode()
    )
    with pytest.raises(
        ValueError,
        match=exactly(
            "peer beta's public key cannot be used: RSA keys of 8 bits are refused: "
            "at least 2048 bits are required."
        ),
    ):
        config(peer_public_keys={**KEYS, "beta": short_rsa})


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (
            "AAAAC3NzaC1lZDI1NTE5",
            "peer beta's public key is not an OpenSSH public key line ('TYPE BASE64 [COMMENT]').",
        ),
        (
            "ssh-dss AAAAB3NzaC1kc3MAAACBAP",
            "peer beta's public key type 'ssh-dss' is not accepted: use ssh-ed25519, ECDSA or RSA.",
        ),
        ("ssh-ed25519 not*base64", "peer beta's public key is not valid base64."),
        ("ssh-rsa " + KEYS["delta"].split()[1], "peer beta's public key blob does not hold a ssh-rsa key."),
        (
            "ssh-ed25519 " + base64.b64encode(b"\x00\x00\x00\x0bssh-ed25519").decode(),
            "peer beta's public key blob does not hold a ssh-ed25519 key.",
        ),
        (
            "ssh-ed25519 " + base64.b64encode(b"\x00\x00").decode(),
            "peer beta's public key blob does not hold a ssh-ed25519 key.",
        ),
    ],
    # Fixed ids (a key made at import is in one case): the same names in every collecting process.
    ids=["no-type", "ssh-dss", "not-base64", "ed25519-blob-as-rsa", "truncated-blob", "short-blob"],
)
def test_malformed_public_keys_are_refused(line: str, message: str) -> None:
    with pytest.raises(ValueError, match=exactly(message)):
        config(peer_public_keys={**KEYS, "beta": line})


@pytest.mark.slow
def test_real_ssh_keygen_keys_of_every_type_are_accepted(ssh_key_factory: Callable[..., Any]) -> None:
    keys = {
        "beta": ssh_key_factory("beta").public_line,
        "delta": ssh_key_factory("delta", key_type="ecdsa").public_line,
        "gamma": ssh_key_factory("gamma", key_type="rsa").public_line,
    }
    assert config(peer_public_keys=keys).peer_public_keys == keys


@pytest.mark.parametrize(
    ("changes", "error"),
    [
        ({"enabled": 1}, "enabled must be true or false, not int."),
        ({"required_approvals": True}, "required_approvals must be an integer, not bool."),
        ({"required_approvals": 2.0}, "required_approvals must be an integer, not float."),
        ({"timeout_seconds": "120"}, "timeout_seconds must be an integer, not str."),
        ({"peer_agent_ids": "beta"}, "peer_agent_ids must be a list of strings, not str."),
        ({"peer_agent_ids": ["beta", 2]}, "peer_agent_ids must hold only strings, not int."),
        ({"high_risk_patterns": None}, "high_risk_patterns must be a list of strings, not NoneType."),
        (
            {"peer_public_keys": ["beta"]},
            "peer_public_keys must be a mapping of agent id to string, not list.",
        ),
        ({"peer_relay_urls": {"beta": 1}}, "peer_relay_urls must map strings to strings."),
        ({"allow_dev_signatures": "no"}, "allow_dev_signatures must be true or false."),
        ({"local_relay_base_url": 8701}, "local_relay_base_url must be a string or None."),
    ],
)
@pytest.mark.parametrize("enabled", [True, False])
def test_types_are_checked_enabled_or_not(changes: dict[str, Any], error: str, enabled: bool) -> None:
    with pytest.raises(TypeError, match=exactly(error)):
        config(**{"enabled": enabled, **changes})


def test_a_disabled_configuration_is_not_checked_beyond_types() -> None:
    off = MultiSigQuorumConfig(
        enabled=False,
        required_approvals=0,
        peer_agent_ids=["Beta", "Beta"],
        peer_public_keys={"Beta": "nonsense"},
        high_risk_patterns=[""],
        timeout_seconds=0,
    )
    assert not off.is_high_risk("")
    assert not off.is_high_risk("anything")


def test_check_origin() -> None:
    built = config()
    built.check_origin("alpha")
    with pytest.raises(
        ValueError,
        match=exactly("agent beta is listed among its own peers; a node cannot approve its own calls."),
    ):
        built.check_origin("beta")
    MultiSigQuorumConfig(enabled=False, peer_agent_ids=["beta"]).check_origin("beta")


def test_a_policy_whose_agent_is_among_its_peers_is_refused(workspace: Path) -> None:
    with pytest.raises(ValueError, match="agent gamma is listed among its own peers"):
        ApprovalPolicy.for_workspace(workspace, agent_id="gamma", multi_sig_config=config())


@pytest.mark.parametrize(
    ("tool", "high"),
    [
        ("shell.run", True),
        ("shell.", True),
        ("fs.delete", True),
        ("fs.deleted", False),
        ("Shell.run", False),  # fnmatchcase: case-sensitive on every platform
        ("fs.read", False),
        ("myshell.run", False),
        ("shell", False),
    ],
)
def test_is_high_risk(tool: str, high: bool) -> None:
    assert config().is_high_risk(tool) is high


def test_is_high_risk_with_bracket_and_question_patterns() -> None:
    built = config(high_risk_patterns=["fs.[dm]*", "net.?et"])
    assert built.is_high_risk("fs.move")
    assert built.is_high_risk("net.get")
    assert not built.is_high_risk("fs.read")
    assert not built.is_high_risk("net.post")


def test_collections_are_copied_when_built() -> None:
    patterns = ["shell.*"]
    peers = list(PEERS)
    built = config(high_risk_patterns=patterns, peer_agent_ids=peers)
    patterns.append("fs.*")
    peers.append("alpha")
    assert not built.is_high_risk("fs.read")
    assert built.peer_agent_ids == PEERS
    built.check_origin("alpha")


def test_dev_signatures_are_warned_about(caplog: pytest.LogCaptureFixture) -> None:
    config(allow_dev_signatures=True)
    assert "dev:<signer> signatures without cryptography" in caplog.text


# -- PeerSignature ----------------------------------------------------------------------------------


def test_peer_signature() -> None:
    signature = PeerSignature(peer_id="beta", signature="AAAA", timestamp=1764570003.0, ssh_key_id="SHA256:x")
    assert [field.name for field in dataclasses.fields(PeerSignature)] == [
        "peer_id",
        "signature",
        "timestamp",
        "ssh_key_id",
    ]
    assert signature.to_dict() == {
        "peer_id": "beta",
        "signature": "AAAA",
        "timestamp": 1764570003.0,
        "ssh_key_id": "SHA256:x",
    }
    assert PeerSignature("beta", "AAAA", 1).ssh_key_id is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        signature.peer_id = "gamma"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"peer_id": 1}, "peer_id and signature must be strings."),
        ({"signature": None}, "peer_id and signature must be strings."),
        ({"timestamp": "now"}, "timestamp must be a number of Unix seconds, not str."),
        ({"timestamp": True}, "timestamp must be a number of Unix seconds, not bool."),
        ({"ssh_key_id": 5}, "ssh_key_id must be a string or None."),
    ],
)
def test_peer_signature_types(fields: dict[str, Any], message: str) -> None:
    base: dict[str, Any] = {"peer_id": "beta", "signature": "AAAA", "timestamp": 1.0, "ssh_key_id": None}
    with pytest.raises(TypeError, match=exactly(message)):
        PeerSignature(**{**base, **fields})
