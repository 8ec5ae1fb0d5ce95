"""``teaagent init``: one node, or a whole local cluster whose configurations name each other."""

from __future__ import annotations

import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from relay_support import shell_request

from teaagent._http import client_verify
from teaagent.cli._init import PORTS_PER_NODE, required_for
from teaagent.cli._main import run
from teaagent.config import load_config
from teaagent.policy import PermissionMode
from teaagent.quorum import approval_statement, sign_approval, sign_request
from teaagent.relay_client import RelayClient
from teaagent.signing import fingerprint

WAIT = 20.0


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _ports(folder: Path) -> list[int]:
    config = load_config(folder / "node.toml")
    relay = int(config.relay_url.rsplit(":", 1)[1])
    return [config.agent.port, relay, config.approver.port]


def test_init_makes_one_node_with_its_key_config_and_data_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "alpha"

    assert run(["init", str(folder)]) == 0

    config = load_config(folder / "node.toml")
    assert config.agent_id == "alpha"  # the folder's name
    assert config.private_key == folder / "keys" / "alpha"
    assert config.uses_embedded_redis
    assert config.workspace == folder / "workspace"
    assert config.workspace.is_dir()
    assert config.data_dir == folder / "data"
    assert _mode(config.data_dir) == 0o700
    assert _mode(config.private_key) == 0o600
    assert _mode(config.token_path) == 0o600
    assert config.load_token() == config.token_path.read_text().strip()
    assert not config.quorum.enabled
    assert config.peers == {}
    assert config.agent.permission_mode == PermissionMode.WORKSPACE_WRITE  # alone, nothing guards shell.run
    # ssh-keygen made it: ssh-keygen reads it back, and it is the key the configuration names.
    listed = subprocess.run(
        ["ssh-keygen", "-l", "-f", str(config.private_key)], capture_output=True, text=True, check=True
    )
    assert listed.stdout.split()[1] == fingerprint(config.own_public_key())
    agent, relay, approver = _ports(folder)
    assert (relay, approver) == (agent + 1, agent + 2)
    out = capsys.readouterr().out
    assert f"teaagent relay serve --config {folder / 'node.toml'}" in out


def test_the_commented_script_line_of_a_new_node_names_a_bundled_script(tmp_path: Path) -> None:
    folder = tmp_path / "alpha"
    assert run(["init", str(folder)]) == 0
    path = folder / "node.toml"
    text = path.read_text()
    assert load_config(path).agent.script is None  # commented out: the demo plays

    path.write_text(text.replace('# script = "quorum"', 'script = "quorum"', 1))

    assert load_config(path).agent.script == "quorum"


def test_init_cluster_configurations_name_each_other(tmp_path: Path) -> None:
    names = ["alpha", "beta", "gamma"]

    assert run(["init", "--cluster", ",".join(names), str(tmp_path)]) == 0

    configs = {name: load_config(tmp_path / name / "node.toml") for name in names}
    for name, config in configs.items():
        others = [other for other in names if other != name]
        assert list(config.peers) == others
        for other in others:
            peer = config.peers[other]
            assert peer.public_key == (tmp_path / other / "keys" / f"{other}.pub").read_text().strip()
            assert peer.relay_url == configs[other].relay_url
        assert config.quorum.enabled
        assert config.quorum.required_approvals == required_for(2) == 1
        # Every destructive tool is high risk: the peers decide it, the local mode lets it reach them.
        assert config.agent.permission_mode == PermissionMode.DANGER_FULL_ACCESS
        assert all(config.quorum.is_high_risk(tool) for tool in ("shell.run", "fs.delete"))
        assert config.quorum.high_risk_patterns == ["shell.*", "fs.delete"]
        assert config.approver.decision_for("shell.run", {"command": "sudo rm -rf /"}) == "deny"
        assert config.approver.decision_for("shell.run", {"command": "make test"}) == "ask"
    ports = [port for name in names for port in _ports(tmp_path / name)]
    assert ports == list(range(ports[0], ports[0] + PORTS_PER_NODE * len(names)))


def test_init_moves_a_loopback_cluster_past_a_port_in_use(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        base = taken - 4  # the taken port is beta's relay port

        assert run(["init", "--cluster", "alpha,beta", str(tmp_path), "--base-port", str(base)]) == 0

    ports = _ports(tmp_path / "alpha") + _ports(tmp_path / "beta")
    assert ports[0] > taken  # every block from base up to it holds the taken port
    assert taken not in ports
    assert ports == list(range(ports[0], ports[0] + 6))


def test_init_cluster_on_other_hosts_keeps_the_ports_and_names_the_hosts(tmp_path: Path) -> None:
    code = run(
        [
            "init",
            "--cluster",
            "alpha,beta",
            str(tmp_path),
            "--host",
            "relay-{name}",
            "--redis-url",
            "redis://valkey:6379/0",
            "--required",
            "1",
        ]
    )

    assert code == 0
    alpha = load_config(tmp_path / "alpha" / "node.toml")
    assert alpha.relay_url == "http://relay-alpha:8701"
    assert alpha.peers["beta"].relay_url == "http://relay-beta:8704"
    assert alpha.redis_url == "redis://valkey:6379/0"
    assert (alpha.agent.port, alpha.approver.port) == (8700, 8702)


def test_init_never_overwrites_a_node(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["init", str(tmp_path / "alpha")]) == 0
    key = (tmp_path / "alpha" / "keys" / "alpha").read_bytes()
    capsys.readouterr()

    assert run(["init", str(tmp_path / "alpha")]) == 2

    assert capsys.readouterr().err == (
        f"teaagent: {tmp_path / 'alpha' / 'node.toml'} already exists: "
        "teaagent init never overwrites a configuration or a key.\n"
    )
    assert (tmp_path / "alpha" / "keys" / "alpha").read_bytes() == key


def test_init_if_missing_leaves_a_made_cluster_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(["init", "--cluster", "alpha,beta", str(tmp_path), "--if-missing"]) == 0
    before = (tmp_path / "beta" / "node.toml").read_bytes()
    capsys.readouterr()

    assert run(["init", "--cluster", "alpha,beta", str(tmp_path), "--if-missing"]) == 0

    assert capsys.readouterr().out == f"{tmp_path}: alpha, beta already initialised; nothing changed.\n"
    assert (tmp_path / "beta" / "node.toml").read_bytes() == before


def test_init_if_missing_refuses_a_half_made_cluster(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(["init", "--cluster", "alpha,beta", str(tmp_path)]) == 0
    (tmp_path / "beta" / "node.toml").unlink()
    capsys.readouterr()

    assert run(["init", "--cluster", "alpha,beta", str(tmp_path), "--if-missing"]) == 2

    assert capsys.readouterr().err == (
        f"teaagent: the cluster is half made: {tmp_path / 'beta' / 'node.toml'} is missing; "
        "remove the folder and run init again.\n"
    )


@pytest.mark.parametrize(
    ("arguments", "sentence"),
    [
        (
            ["--cluster", "alpha,Beta"],
            "'Beta' is not a valid agent id: use 1 to 64 lowercase letters, digits, '.', '_' or '-', "
            "starting with a letter or digit.",
        ),
        (
            ["--cluster", "alpha"],
            "--cluster needs at least two node names, separated by commas (alpha,beta,gamma).",
        ),
        (["--cluster", "alpha,beta,alpha"], "--cluster names a node twice: alpha,beta,alpha."),
        (
            ["--cluster", "alpha,beta", "--required", "2"],
            "--required 2 is not between 1 and the 1 peers of each node.",
        ),
        (
            ["--cluster", "alpha,beta", "--name", "alpha"],
            "--name is for one node; with --cluster the names are the cluster's.",
        ),
        (
            ["--redis-url", "http://x"],
            "--redis-url must be 'embedded' or a redis://, rediss:// or unix:// URL, not 'http://x'.",
        ),
        (
            ["--redis-url", "redis://[::1"],  # urlsplit's own ValueError, never an internal error
            "--redis-url must be 'embedded' or a redis://, rediss:// or unix:// URL, not 'redis://[::1'.",
        ),
        (["--host", "[::1"], "--host '[::1' does not make a usable relay URL (http://[[::1]:8701)."),
        (
            ["--base-port", "65534", "--host", "relay"],
            "--base-port 65534 leaves no room for 3 ports below 65536.",
        ),
    ],
)
def test_init_refuses_bad_usage_with_one_sentence(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], arguments: list[str], sentence: str
) -> None:
    assert run(["init", str(tmp_path / "node"), *arguments]) == 2

    assert capsys.readouterr().err == f"teaagent: {sentence}\n"
    assert not (tmp_path / "node" / "node.toml").exists()
    assert not list(tmp_path.rglob("node.toml"))


@pytest.mark.slow
def test_an_initialised_cluster_passes_a_request_and_its_approval(tmp_path: Path) -> None:
    """What init wrote is enough: the relays start, a request reaches the peer, its approval counts."""
    assert run(["init", "--cluster", "alpha,beta", str(tmp_path)]) == 0
    alpha = load_config(tmp_path / "alpha" / "node.toml")
    beta = load_config(tmp_path / "beta" / "node.toml")
    relays = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "teaagent",
                "relay",
                "serve",
                "--config",
                str(config.path),
                "--log-level",
                "warning",
            ],
            stdout=subprocess.DEVNULL,
            stderr=(tmp_path / f"relay-{config.agent_id}.log").open("wb"),
        )
        for config in (alpha, beta)
    ]
    try:
        for config in (alpha, beta):
            _wait_healthy(config.relay_url)
        request = shell_request(alpha.quorum, "make test", reason="run the tests")
        with RelayClient(alpha.relay_url, token=alpha.load_token()) as client:
            client.submit_request(request, sign_request(request, alpha.signer()))
            with RelayClient(beta.relay_url, token=beta.load_token()) as inbox:
                items = inbox.list_inbox(wait=WAIT)
                assert [item.request_id for item in items] == [request["request_id"]]
                approval = sign_approval(request, "beta", beta.signer())
                inbox.submit_decision(
                    request["request_id"],
                    approval_statement(request, "beta", int(approval.timestamp)),
                    approval.signature,
                )
            outcome = client.wait_outcome(request["request_id"], WAIT)
    finally:
        for relay in relays:
            relay.terminate()
        for relay in relays:
            relay.wait(timeout=WAIT)

    assert outcome.state == "approved"
    assert outcome.signers == ("beta",)
    assert [relay.returncode for relay in relays] == [0, 0]


def _wait_healthy(url: str) -> None:
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=0.5, verify=client_verify()).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    pytest.fail(f"the relay at {url} never answered")


def test_init_with_a_certificate_makes_an_https_relay_that_trusts_its_ca(tmp_path: Path) -> None:
    from tls_support import PrivateCA

    ca = PrivateCA(tmp_path / "tls")
    files = ca.issue("alpha", hosts=("alpha.example.net",))
    code = run(
        [
            "init",
            str(tmp_path / "alpha"),
            "--host",
            "alpha.example.net",
            "--base-port",
            "8700",
            "--tls-cert",
            str(files.cert),
            "--tls-key",
            str(files.key),
            "--tls-ca",
            str(ca.cert_path),
        ]
    )

    assert code == 0
    config = load_config(tmp_path / "alpha" / "node.toml")
    assert config.relay_url == "https://alpha.example.net:8701"
    assert (config.tls.cert, config.tls.key, config.tls.ca) == (files.cert, files.key, ca.cert_path)


def test_init_refuses_a_tls_key_of_another_certificate_before_making_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tls_support import PrivateCA

    ca = PrivateCA(tmp_path / "tls")
    one, other = ca.issue("one"), ca.issue("other")

    code = run(["init", str(tmp_path / "alpha"), "--tls-cert", str(one.cert), "--tls-key", str(other.key)])

    assert code == 2
    assert capsys.readouterr().err == "teaagent: the TLS files do not load: key values mismatch.\n"
    assert not (tmp_path / "alpha").exists()


def test_init_takes_the_base_port_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """$TEAAGENT_BASE_PORT, as the README says: the same commands, the nodes elsewhere."""
    monkeypatch.setenv("TEAAGENT_BASE_PORT", "31000")
    code = run(["init", "--cluster", "alpha,beta", str(tmp_path), "--host", "relay-{name}"])

    assert code == 0
    assert _ports(tmp_path / "alpha") + _ports(tmp_path / "beta") == list(range(31000, 31006))


def test_init_cluster_writes_a_commented_rules_example_that_loads_once_uncommented(tmp_path: Path) -> None:
    assert run(["init", "--cluster", "alpha,beta,gamma", str(tmp_path)]) == 0
    path = tmp_path / "alpha" / "node.toml"
    text = path.read_text()
    assert load_config(path).quorum.rules == ()  # commented out: version 1 until the operator says so
    start = text.index("# [quorum.groups]")
    end = text.index("# any one peer") + len("# any one peer")
    block = text[start:end]
    uncommented = "\n".join(line.removeprefix("# ") for line in block.splitlines())
    text = text.replace(block, uncommented).replace('"fs.delete"]', '"fs.delete", "git.push*"]', 1)
    path.write_text(text)
    quorum = load_config(path).quorum
    push = quorum.policy_for("git.push")
    assert push is not None
    assert push.mode == "all_of"
    assert [(term.group, term.peers, term.required) for term in push.terms] == [
        ("ops", ("beta",), 1),
        ("security", ("gamma",), 1),
    ]
    assert quorum.policy_for("fs.delete") is not None
