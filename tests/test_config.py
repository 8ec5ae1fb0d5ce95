"""teaagent.config: the node configuration file, its defaults, and one exact sentence per mistake.

The keys it names (the node's, its peers', its operators') are in ``test_config_keys.py``.
"""

from __future__ import annotations

import os
import re
import stat
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from config_support import EXAMPLE, LINES, RL, RSA_LINES, load, write_private_key
from config_support import fixture_node_dir as fixture_node_dir  # the fixture
from key_forms import sk_form

from teaagent.config import (
    CONFIG_ENV_VAR,
    AgentSettings,
    ApproverRule,
    ApproverSettings,
    PeerConfig,
    load_config,
)
from teaagent.errors import ConfigError
from teaagent.policy import MultiSigQuorumConfig, PermissionMode
from teaagent.tools import ToolRateLimit


def test_the_architecture_example_loads(node_dir: Path) -> None:
    config = load(EXAMPLE)
    assert config.path == node_dir / "alpha.toml"
    assert config.agent_id == "alpha"
    assert config.private_key == node_dir / "keys" / "alpha"
    assert config.public_key is None
    assert config.redis_url == "redis://127.0.0.1:6379/0"
    assert not config.uses_embedded_redis
    assert config.relay_url == "http://127.0.0.1:8701"
    assert config.workspace == node_dir / "workspace"
    assert config.data_dir == node_dir / ".teaagent-alpha"
    assert config.token is None
    assert config.agent == AgentSettings(
        permission_mode=PermissionMode.WORKSPACE_WRITE, provider="scripted", port=8700
    )
    assert config.quorum == MultiSigQuorumConfig(
        enabled=True,
        required_approvals=2,
        peer_agent_ids=["beta", "gamma", "delta"],
        peer_public_keys={name: LINES[name] for name in ("beta", "gamma", "delta")},
        peer_relay_urls={
            "beta": "http://127.0.0.1:8702",
            "gamma": "http://127.0.0.1:8712",
            "delta": "https://delta.example:8722",
        },
        local_relay_base_url="http://127.0.0.1:8701",
        allow_dev_signatures=False,
        high_risk_patterns=["shell.*", "fs.delete"],
        timeout_seconds=120,
    )
    assert config.peers["beta"] == PeerConfig(
        agent_id="beta", public_key=LINES["beta"], relay_url="http://127.0.0.1:8702"
    )
    assert list(config.peers) == ["beta", "gamma", "delta"]
    assert config.approver == ApproverSettings(
        port=8703,
        rules=(
            ApproverRule(tool="shell.*", arguments={"command": "echo *"}, decision="approve"),
            ApproverRule(tool="fs.delete", decision="deny", reason="never delete"),
        ),
    )
    assert config.own_public_key().to_line() == LINES["alpha"]
    assert config.public_key_of("alpha") == LINES["alpha"]
    assert config.public_key_of("gamma") == LINES["gamma"]
    assert config.public_key_of("mallory") is None


def test_a_minimal_file_takes_the_documented_defaults(node_dir: Path) -> None:
    config = load('agent_id = "alpha"\nprivate_key = "keys/alpha"\nrelay_url = "http://127.0.0.1:8701"\n')
    assert config.redis_url == "embedded"
    assert config.uses_embedded_redis
    assert config.workspace == node_dir / "workspace"
    assert config.data_dir == node_dir / ".teaagent-alpha"
    assert config.agent == AgentSettings()
    assert config.agent.permission_mode is PermissionMode.PROMPT
    assert config.agent.provider == "scripted"
    assert (config.agent.port, config.approver.port) == (8700, 8703)
    assert config.quorum.enabled is False
    assert config.quorum.is_high_risk("shell.run") is False
    assert config.peers == {}
    assert config.approver.rules == ()


def test_paths_are_relative_to_the_file_not_to_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "etc" / "node"
    write_private_key(folder / "secret" / "id")
    (folder / "alpha.toml").write_text(
        'agent_id = "alpha"\nprivate_key = "secret/id"\nrelay_url = "http://127.0.0.1:8701"\n'
        f'workspace = "../work"\ndata_dir = "{tmp_path / "state"}"\n'
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    config = load_config(Path("..") / "etc" / "node" / "alpha.toml")
    assert config.private_key is not None
    assert config.private_key.resolve() == (folder / "secret" / "id").resolve()
    assert config.workspace.resolve() == (tmp_path / "etc" / "work").resolve()
    assert config.data_dir == tmp_path / "state"
    assert config.path.is_absolute()


def test_teaagent_config_names_the_file_when_no_path_is_given(
    node_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (node_dir / "alpha.toml").write_text(EXAMPLE)
    monkeypatch.setenv(CONFIG_ENV_VAR, str(node_dir / "alpha.toml"))
    assert load_config(None).agent_id == "alpha"
    assert load_config().agent_id == "alpha"


def test_without_a_path_or_teaagent_config_the_sentence_says_what_to_do(node_dir: Path) -> None:
    with pytest.raises(
        ConfigError, match=r"^no configuration file was given: pass --config PATH or set TEAAGENT_CONFIG\.$"
    ):
        load_config(None)


def test_an_ssh_agent_key_is_named_by_its_public_key(node_dir: Path) -> None:
    text = EXAMPLE.replace('private_key = "keys/alpha"', f'public_key = "{LINES["alpha"]}"')
    config = load(text)
    assert (config.private_key, config.public_key) == (None, LINES["alpha"])
    assert config.own_public_key().to_line() == LINES["alpha"]


def test_a_disabled_quorum_needs_no_threshold_and_keeps_its_peers(node_dir: Path) -> None:
    text = EXAMPLE.replace("enabled = true\nrequired_approvals = 2\n", "enabled = false\n")
    config = load(text)
    assert config.quorum.enabled is False
    assert config.quorum.peer_agent_ids == ["beta", "gamma", "delta"]
    assert config.quorum.is_high_risk("shell.run") is False


def test_the_signer_is_the_loaded_private_key(node_dir: Path) -> None:
    signer = load(EXAMPLE).signer()
    assert signer.public_key.to_line() == LINES["alpha"]


# --- one sentence per mistake ----------------------------------------------------------------------------

NOT_ONE_OF_MODES = "read-only, workspace-write, prompt, allow, danger-full-access"


def _without_peers(text: str) -> str:
    start, end = text.index("[peers.beta]"), text.index("[approver]")
    return text[:start] + text[end:]


def _one_peer(text: str) -> str:
    start, end = text.index("[peers.gamma]"), text.index("[approver]")
    return text[:start] + text[end:]


CASES: list[tuple[str, Callable[[str], str], str]] = [
    (
        "threshold above the peers",
        lambda t: t.replace("required_approvals = 2", "required_approvals = 4"),
        "alpha.toml: quorum.required_approvals is 4 but only 3 peers are configured.",
    ),
    (
        "threshold above one peer",
        lambda t: _one_peer(t),
        "alpha.toml: quorum.required_approvals is 2 but only 1 peer is configured.",
    ),
    (
        "threshold without peers",
        lambda t: _without_peers(t),
        "alpha.toml: quorum.required_approvals is 2 but no peers are configured.",
    ),
    (
        "threshold zero",
        lambda t: t.replace("required_approvals = 2", "required_approvals = 0"),
        "alpha.toml: quorum.required_approvals must be at least 1, not 0.",
    ),
    (
        "threshold of the wrong type",
        lambda t: t.replace("required_approvals = 2", 'required_approvals = "2"'),
        "alpha.toml: quorum.required_approvals must be an integer, not a string.",
    ),
    (
        "boolean threshold",
        lambda t: t.replace("required_approvals = 2", "required_approvals = true"),
        "alpha.toml: quorum.required_approvals must be an integer, not a boolean.",
    ),
    (
        "misspelt enabled",
        lambda t: t.replace("enabled = true", "enabeld = true"),
        "alpha.toml: unknown key quorum.enabeld (did you mean quorum.enabled?).",
    ),
    (
        "enabled left out",
        lambda t: t.replace("enabled = true\n", ""),
        "alpha.toml: the required key quorum.enabled is missing.",
    ),
    (
        "enabled as text",
        lambda t: t.replace("enabled = true", 'enabled = "yes"'),
        "alpha.toml: quorum.enabled must be true or false, not a string.",
    ),
    (
        "threshold left out",
        lambda t: t.replace("required_approvals = 2\n", ""),
        "alpha.toml: the required key quorum.required_approvals is missing.",
    ),
    (
        "patterns left out",
        lambda t: t.replace('high_risk_patterns = ["shell.*", "fs.delete"]\n', ""),
        "alpha.toml: the required key quorum.high_risk_patterns is missing.",
    ),
    (
        "no patterns",
        lambda t: t.replace('high_risk_patterns = ["shell.*", "fs.delete"]', "high_risk_patterns = []"),
        "alpha.toml: quorum.high_risk_patterns is empty, so no tool call would need the quorum.",
    ),
    (
        "an empty pattern",
        lambda t: t.replace('["shell.*", "fs.delete"]', '["shell.*", " "]'),
        "alpha.toml: quorum.high_risk_patterns holds an empty pattern.",
    ),
    (
        "patterns as a string",
        lambda t: t.replace('["shell.*", "fs.delete"]', '"shell.*"'),
        "alpha.toml: quorum.high_risk_patterns must be an array of strings, not a string.",
    ),
    (
        "timeout zero",
        lambda t: t.replace("timeout_seconds = 120", "timeout_seconds = 0"),
        "alpha.toml: quorum.timeout_seconds must be between 1 and 86400, not 0.",
    ),
    (
        "timeout above a day",
        lambda t: t.replace("timeout_seconds = 120", "timeout_seconds = 86401"),
        "alpha.toml: quorum.timeout_seconds must be between 1 and 86400, not 86401.",
    ),
    (
        "unknown top-level key",
        lambda t: t.replace(
            'relay_url = "http://127.0.0.1:8701"', 'relay_url = "http://127.0.0.1:8701"\nrelay_ulr = "x"'
        ),
        "alpha.toml: unknown key relay_ulr (did you mean relay_url?).",
    ),
    (
        "unknown key without a near name",
        lambda t: t.replace("[agent]\n", "[agent]\ncolour = 3\n"),
        "alpha.toml: unknown key agent.colour.",
    ),
    (
        "unknown peer key",
        lambda t: t.replace('relay_url = "http://127.0.0.1:8702"', 'relay = "http://127.0.0.1:8702"'),
        "alpha.toml: unknown key peers.beta.relay (did you mean peers.beta.relay_url?).",
    ),
    (
        "unknown rule key",
        lambda t: t.replace('decision = "approve"', 'decison = "approve"'),
        "alpha.toml: unknown key approver.rules[0].decison (did you mean approver.rules[0].decision?).",
    ),
    (
        "agent id left out",
        lambda t: t.replace('agent_id = "alpha"\n', ""),
        "alpha.toml: the required key agent_id is missing.",
    ),
    (
        "bad agent id",
        lambda t: t.replace('agent_id = "alpha"', 'agent_id = "Alpha One"'),
        "alpha.toml: agent_id 'Alpha One' is not a valid agent id: use 1 to 64 lowercase letters, digits, "
        "'.', '_' or '-', starting with a letter or digit.",
    ),
    (
        "relay URL left out",
        lambda t: t.replace('relay_url = "http://127.0.0.1:8701"\n', ""),
        "alpha.toml: the required key relay_url is missing.",
    ),
    (
        "relay URL not http",
        lambda t: t.replace('relay_url = "http://127.0.0.1:8701"', 'relay_url = "ftp://relay"'),
        "alpha.toml: relay_url must be an http:// or https:// URL, not 'ftp://relay'.",
    ),
    (
        # urlsplit raises a bare ValueError there: one sentence of ours instead, never a traceback.
        "relay URL urlsplit cannot read",
        lambda t: t.replace('relay_url = "http://127.0.0.1:8701"', 'relay_url = "http://[::1"'),
        "alpha.toml: relay_url must be an http:// or https:// URL, not 'http://[::1'.",
    ),
    (
        "redis URL urlsplit cannot read",
        lambda t: t.replace("redis://127.0.0.1:6379/0", "redis://[::1"),
        "alpha.toml: redis_url must be \"embedded\" or a redis://, rediss:// or unix:// URL, not 'redis://[::1'.",
    ),
    (
        "redis URL of another scheme",
        lambda t: t.replace("redis://127.0.0.1:6379/0", "mysql://db"),
        "alpha.toml: redis_url must be \"embedded\" or a redis://, rediss:// or unix:// URL, not 'mysql://db'.",
    ),
    (
        "a cluster on the embedded server",
        lambda t: t.replace(
            'redis_url = "redis://127.0.0.1:6379/0"', 'redis_url = "embedded"\nredis_cluster = true'
        ),
        'alpha.toml: redis_cluster = true needs redis_url to name a node of the cluster: "embedded" is one '
        "private server, never a cluster.",
    ),
    (
        "a cluster over a unix socket",
        lambda t: t.replace(
            'redis_url = "redis://127.0.0.1:6379/0"',
            'redis_url = "unix:///run/redis.sock"\nredis_cluster = true',
        ),
        "alpha.toml: redis_cluster = true needs a redis:// or rediss:// redis_url: a cluster's nodes are "
        "reached over TCP, not unix://.",
    ),
    (
        "a cluster's database 1",
        lambda t: t.replace(
            'redis_url = "redis://127.0.0.1:6379/0"',
            'redis_url = "redis://127.0.0.1:7000/1"\nredis_cluster = true',
        ),
        "alpha.toml: redis_cluster = true needs database 0 in redis_url: a cluster has no other.",
    ),
    (
        "redis_cluster as a string",
        lambda t: t.replace(
            'redis_url = "redis://127.0.0.1:6379/0"',
            'redis_url = "redis://127.0.0.1:6379/0"\nredis_cluster = "yes"',
        ),
        "alpha.toml: redis_cluster must be true or false, not a string.",
    ),
    (
        "short token",
        lambda t: t.replace('workspace = "workspace"', 'workspace = "workspace"\ntoken = "secret"'),
        "alpha.toml: token must be at least 16 characters long.",
    ),
    (
        "bad permission mode",
        lambda t: t.replace('"workspace-write"', '"yolo"'),
        f"alpha.toml: agent.permission_mode is 'yolo', which is not one of {NOT_ONE_OF_MODES}.",
    ),
    (
        "port out of range",
        lambda t: t.replace("port = 8700", "port = 70000"),
        "alpha.toml: agent.port must be a TCP port between 1 and 65535, not 70000.",
    ),
    (
        "two services on one port",
        lambda t: t.replace("port = 8703", "port = 8700"),
        "alpha.toml: agent.port and approver.port are both 8700.",
    ),
    (
        "agent as a value",
        lambda t: t.replace("[agent]\n", 'agent = "x"\n[agent_settings]\n'),
        "alpha.toml: unknown key agent_settings.",
    ),
    (
        "peer key that does not parse",
        lambda t: t.replace(LINES["beta"], "ssh-ed25519 AAAA beta"),
        "alpha.toml: peers.beta.public_key is not a usable SSH public key: ",
    ),
    (
        "peer of an unknown key type",
        lambda t: t.replace(LINES["beta"], "ssh-dss AAAAB3NzaC1kc3M beta"),
        "alpha.toml: peers.beta.public_key is not a usable SSH public key: ",
    ),
    (
        "peer key left out",
        lambda t: t.replace(f'public_key = "{LINES["beta"]}"\n', ""),
        "alpha.toml: peers.beta has no key: set public_key, public_keys or allowed_signers.",
    ),
    (
        "peer relay left out",
        lambda t: t.replace('relay_url = "http://127.0.0.1:8702"\n', ""),
        "alpha.toml: the required key peers.beta.relay_url is missing.",
    ),
    (
        "peer relay not a URL",
        lambda t: t.replace('"http://127.0.0.1:8702"', '"127.0.0.1:8702"'),
        "alpha.toml: peers.beta.relay_url must be an http:// or https:// URL, not '127.0.0.1:8702'.",
    ),
    (
        "the origin among its peers",
        lambda t: t.replace("[peers.beta]", "[peers.alpha]"),
        "alpha.toml: peers.alpha is this node itself (agent_id = 'alpha'); "
        "a node cannot approve its own calls.",
    ),
    (
        "a bad peer name",
        lambda t: t.replace("[peers.beta]", "[peers.Beta]"),
        "alpha.toml: peers.Beta is not a valid agent id: use 1 to 64 lowercase letters, digits, "
        "'.', '_' or '-', starting with a letter or digit.",
    ),
    (
        "two peers with one key",
        lambda t: t.replace(LINES["gamma"], LINES["beta"].replace(" beta", " copy")),
        "alpha.toml: peers.beta.public_key and peers.gamma.public_key are the same key, "
        "which would count twice.",
    ),
    (
        "a peer with this node's key",
        lambda t: t.replace(LINES["delta"], LINES["alpha"]),
        "alpha.toml: peers.delta.public_key is this node's own key, which would count this node as a peer.",
    ),
    (
        "two peers with one key, once in its security-key form",
        lambda t: t.replace(LINES["gamma"], sk_form(LINES["beta"], comment="gamma")),
        "alpha.toml: peers.beta.public_key and peers.gamma.public_key are the same key, "
        "which would count twice.",
    ),
    (
        "two peers with one RSA modulus under two exponents",
        lambda t: t.replace(LINES["beta"], RSA_LINES[0]).replace(LINES["gamma"], RSA_LINES[1]),
        "alpha.toml: peers.beta.public_key and peers.gamma.public_key are the same key, "
        "which would count twice.",
    ),
    (
        "a peer with this node's key in its security-key form",
        lambda t: t.replace(LINES["delta"], sk_form(LINES["alpha"], "ssh:delta")),
        "alpha.toml: peers.delta.public_key is this node's own key, which would count this node as a peer.",
    ),
    (
        "a missing private key file",
        lambda t: t.replace('"keys/alpha"', '"keys/missing"'),
        "alpha.toml: private_key keys/missing does not exist (looked for ",
    ),
    (
        "both key kinds",
        lambda t: t.replace(
            'private_key = "keys/alpha"', f'private_key = "keys/alpha"\npublic_key = "{LINES["alpha"]}"'
        ),
        "alpha.toml: set private_key (a key file) or public_key (a key held by ssh-agent), not both.",
    ),
    (
        "no key at all",
        lambda t: t.replace('private_key = "keys/alpha"\n', ""),
        "alpha.toml: the required key private_key (a key file) or public_key "
        "(a key held by ssh-agent) is missing.",
    ),
    (
        "an agent key that does not parse",
        lambda t: t.replace('private_key = "keys/alpha"', 'public_key = "ssh-ed25519"'),
        "alpha.toml: public_key is not a usable SSH public key: ",
    ),
    (
        "a rule decision outside the three",
        lambda t: t.replace('decision = "approve"', 'decision = "maybe"'),
        "alpha.toml: approver.rules[0].decision is 'maybe', which is not one of approve, deny, ask.",
    ),
    (
        "a rule without a tool",
        lambda t: t.replace('tool = "fs.delete"\n', ""),
        "alpha.toml: the required key approver.rules[1].tool is missing.",
    ),
    (
        "a rule pattern that is not text",
        lambda t: t.replace('command = "echo *"', "command = 1"),
        "alpha.toml: approver.rules[0].arguments.command must be a string, not an integer.",
    ),
    (
        "rules as a table",
        lambda t: t[: t.index("[[approver.rules]]")] + "rules = { tool = 1 }\n",
        "alpha.toml: approver.rules must be an array of tables ([[approver.rules]]).",
    ),
    (
        "a duplicate key",
        lambda t: t.replace('agent_id = "alpha"', 'agent_id = "alpha"\nagent_id = "beta"'),
        "alpha.toml: invalid TOML: Cannot overwrite a value (at line 2, column 18).",
    ),
    (
        "a duplicate table",
        lambda t: t + '\n[peers.beta]\nrelay_url = "http://x"\n',
        "alpha.toml: invalid TOML: Cannot declare ('peers', 'beta') twice (at line 42, column 12).",
    ),
    (
        "a rate limit without max_calls",
        lambda t: t.replace(RL, RL + '\n[agent.rate_limits]\n"shell.run" = { window_seconds = 60 }\n'),
        "alpha.toml: the required key agent.rate_limits.shell.run.max_calls is missing.",
    ),
    (
        "a rate limit of no calls",
        lambda t: t.replace(RL, RL + '\n[agent.rate_limits]\n"fs.read" = { max_calls = 0 }\n'),
        "alpha.toml: agent.rate_limits.fs.read.max_calls must be at least 1, not 0.",
    ),
    (
        "a rate limit window of no time",
        lambda t: t.replace(
            RL, RL + '\n[agent.rate_limits]\n"fs.read" = { max_calls = 1, window_seconds = 0 }\n'
        ),
        "alpha.toml: agent.rate_limits.fs.read.window_seconds must be a number of seconds above 0, not 0.",
    ),
    (
        "a rate limit with an unknown key",
        lambda t: t.replace(RL, RL + '\n[agent.rate_limits]\n"fs.read" = { max_call = 1 }\n'),
        "alpha.toml: unknown key agent.rate_limits.fs.read.max_call "
        "(did you mean agent.rate_limits.fs.read.max_calls?).",
    ),
    (
        "a rate limit beyond what a limiter counts",
        lambda t: t.replace(RL, RL + '\n[agent.rate_limits]\n"fs.read" = { max_calls = 2000000000 }\n'),
        "alpha.toml: agent.rate_limits.fs.read: max_calls must be an integer between 1 and 1,000,000,000, "
        "not 2000000000.",
    ),
    (
        "a dotted tool name without quotes",
        lambda t: t.replace(RL, RL + "\n[agent.rate_limits]\nshell.run = { max_calls = 1 }\n"),
        "alpha.toml: agent.rate_limits.shell is a table of tables: "
        'put a dotted tool name in quotes, "shell.run".',
    ),
    (
        "a syntax error",
        lambda t: t.replace('agent_id = "alpha"', "agent_id = alpha"),
        "alpha.toml: invalid TOML: Invalid value (at line 1, column 12).",
    ),
]


@pytest.mark.parametrize(("mutate", "message"), [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_each_mistake_is_one_sentence_naming_file_and_key(
    node_dir: Path, mutate: Callable[[str], str], message: str
) -> None:
    text = mutate(EXAMPLE)
    assert text != EXAMPLE
    with pytest.raises(ConfigError, match="^" + re.escape(message)) as caught:
        load(text)
    sentence = str(caught.value)
    assert sentence.endswith(".")
    assert "\n" not in sentence


def test_redis_cluster_says_that_redis_url_is_one_node_of_a_cluster(node_dir: Path) -> None:
    assert not load(EXAMPLE).redis_cluster
    config = load(
        EXAMPLE.replace(
            'redis_url = "redis://127.0.0.1:6379/0"',
            'redis_url = "redis://10.0.0.5:7000"\nredis_cluster = true',
        )
    )
    assert config.redis_cluster
    assert config.redis_url == "redis://10.0.0.5:7000"


def test_agent_rate_limits_are_read_per_tool_with_a_minute_by_default(node_dir: Path) -> None:
    config = load(
        EXAMPLE.replace(
            RL,
            RL
            + '\n[agent.rate_limits]\n"shell.run" = { max_calls = 5 }\n'
            + '"fs.read" = { max_calls = 2, window_seconds = 0.5 }\n',
        )
    )
    assert config.agent.rate_limits == {"shell.run": ToolRateLimit(5, 60.0), "fs.read": ToolRateLimit(2, 0.5)}
    assert load(EXAMPLE).agent.rate_limits == {}


def test_a_missing_file(node_dir: Path) -> None:
    with pytest.raises(ConfigError, match=r"^nowhere\.toml: the configuration file does not exist\.$"):
        load_config("nowhere.toml")


def test_a_folder_instead_of_a_file(node_dir: Path) -> None:
    with pytest.raises(ConfigError, match=r"^keys: this is a folder, not a configuration file\.$"):
        load_config("keys")


def test_a_file_that_is_not_utf8(node_dir: Path) -> None:
    Path("alpha.toml").write_bytes(b'agent_id = "\xff"\n')
    with pytest.raises(ConfigError, match=r"^alpha\.toml: the configuration file is not UTF-8 text\.$"):
        load_config("alpha.toml")


def test_the_message_names_the_path_as_given(node_dir: Path) -> None:
    path = node_dir / "alpha.toml"
    path.write_text(EXAMPLE.replace("required_approvals = 2", "required_approvals = 4"))
    with pytest.raises(ConfigError, match="^" + re.escape(f"{path}: quorum.required_approvals is 4 but")):
        load_config(path)


# --- the token ---------------------------------------------------------------------------------------------


def test_the_token_is_generated_once_with_mode_0600_and_reused(node_dir: Path) -> None:
    config = load(EXAMPLE)
    assert not config.token_path.exists()
    token = config.load_token()
    assert len(token) >= 32
    assert config.token_path == node_dir / ".teaagent-alpha" / "token"
    assert stat.S_IMODE(config.token_path.stat().st_mode) == 0o600
    assert stat.S_IMODE(config.data_dir.stat().st_mode) == 0o700
    assert load(EXAMPLE).load_token() == token
    assert sorted(os.listdir(config.data_dir)) == ["token"]


def test_a_token_in_the_file_wins(node_dir: Path) -> None:
    config = load(
        EXAMPLE.replace('workspace = "workspace"', 'workspace = "workspace"\ntoken = "0123456789abcdef"')
    )
    assert config.load_token() == "0123456789abcdef"
    assert not config.token_path.exists()


def test_the_configs_repr_shows_neither_the_token_nor_the_redis_password(node_dir: Path) -> None:
    config = load(
        EXAMPLE.replace(
            'workspace = "workspace"', 'workspace = "workspace"\ntoken = "0123456789abcdef"'
        ).replace('redis_url = "redis://127.0.0.1:6379/0"', 'redis_url = "redis://:hunter2@127.0.0.1:6379/0"')
    )
    assert (config.token, config.redis_url) == ("0123456789abcdef", "redis://:hunter2@127.0.0.1:6379/0")
    shown = repr(config)
    assert "alpha" in shown
    assert "0123456789abcdef" not in shown
    assert "hunter2" not in shown


def test_concurrent_first_uses_agree_on_one_token(node_dir: Path) -> None:
    config = load(EXAMPLE)
    tokens: list[str] = []
    barrier = threading.Barrier(8)

    def first_use() -> None:
        barrier.wait()
        tokens.append(config.load_token())

    threads = [threading.Thread(target=first_use) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(tokens) == 8
    assert len(set(tokens)) == 1
    assert sorted(os.listdir(config.data_dir)) == ["token"]


def test_a_token_file_others_can_read_is_refused(node_dir: Path) -> None:
    config = load(EXAMPLE)
    config.load_token()
    config.token_path.chmod(0o640)
    with pytest.raises(ConfigError, match=r"is accessible by other users; run chmod 600 .*token\.$"):
        config.load_token()


def test_an_empty_token_file_is_refused(node_dir: Path) -> None:
    config = load(EXAMPLE)
    config.data_dir.mkdir(mode=0o700)
    config.token_path.write_text("\n")
    config.token_path.chmod(0o600)
    with pytest.raises(
        ConfigError, match=r"holds fewer than 16 characters; delete it to generate a new token\.$"
    ):
        config.load_token()


# --- approver rules ---------------------------------------------------------------------------------------


RULES = ApproverSettings(
    rules=(
        ApproverRule(tool="shell.run", arguments={"command": "rm *"}, decision="deny", reason="no deletions"),
        ApproverRule(tool="shell.*", arguments={"command": "echo *", "cwd": "build*"}, decision="approve"),
        ApproverRule(tool="fs.read", decision="approve"),
        ApproverRule(tool="fs.*", decision="ask"),
    )
)


@pytest.mark.parametrize(
    ("tool_name", "arguments", "expected"),
    [
        ("shell.run", {"command": "rm -rf build"}, 0),
        ("shell.run", {"command": "echo hi", "cwd": "build/x"}, 1),
        ("shell.exec", {"command": "echo hi", "cwd": "build"}, 1),
        ("shell.run", {"command": "echo hi"}, None),  # cwd missing: the second rule does not match
        ("shell.run", {"command": "echo hi", "cwd": 3}, None),  # only strings match patterns
        ("shell.run", {"command": ["rm", "-rf"]}, None),
        ("Shell.run", {"command": "rm x"}, None),  # case matters
        ("fs.read", {}, 2),
        ("fs.write", {"path": "x"}, 3),
        ("net.fetch", {}, None),
    ],
)
def test_the_first_matching_rule_wins(
    tool_name: str, arguments: dict[str, Any], expected: int | None
) -> None:
    rule = RULES.first_matching_rule(tool_name, arguments)
    assert rule is (None if expected is None else RULES.rules[expected])
    assert RULES.decision_for(tool_name, arguments) == (
        "ask" if expected is None else RULES.rules[expected].decision
    )


def test_a_star_in_an_argument_pattern_matches_everything_after_it() -> None:
    # Documented: put narrow deny rules first, because "echo *" also matches a chained command.
    rule = ApproverRule(tool="shell.run", arguments={"command": "echo *"}, decision="approve")
    assert rule.matches("shell.run", {"command": "echo hi; rm -rf /"})


def test_rules_come_from_the_file_in_order(node_dir: Path) -> None:
    approver = load(EXAMPLE).approver
    assert approver.decision_for("shell.run", {"command": "echo ok"}) == "approve"
    assert approver.decision_for("fs.delete", {"path": "x"}) == "deny"
    assert approver.decision_for("shell.run", {"command": "make"}) == "ask"
