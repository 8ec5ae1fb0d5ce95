"""``teaagent peers add``: node.toml edited with its comments kept, checked, then replaced atomically."""

from __future__ import annotations

import os
import socket
import stat
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import SSHKey

from teaagent.cli._main import run
from teaagent.config import load_config
from teaagent.policy import PermissionMode
from teaagent.signing import fingerprint

ORIGINAL = """\
# alpha, by hand: every comment must survive an edit
agent_id = "alpha"      # this node
private_key = "{key}"
relay_url = "http://127.0.0.1:8701"

[quorum]
enabled = false         # not yet
required_approvals = 1
high_risk_patterns = ["shell.*"]

[peers.beta]            # the first peer
public_key = "{beta}"
relay_url = "http://127.0.0.1:8704"

[approver]
port = 8702
# rules follow one day
"""


@pytest.fixture
def node(tmp_path: Path, ssh_key_factory: Callable[..., SSHKey]) -> Path:
    path = tmp_path / "node.toml"
    path.write_text(
        ORIGINAL.format(key=ssh_key_factory("alpha").private_path, beta=ssh_key_factory("beta").public_line)
    )
    return path


def _lines_in_order(old: str, new: str) -> bool:
    """Every line of ``old`` is in ``new``, in the same order (comments and layout kept)."""
    remaining = iter(new.splitlines())
    return all(any(line == candidate for candidate in remaining) for line in old.splitlines())


def test_peers_add_appends_the_peer_and_keeps_every_comment(
    node: Path, ssh_key_factory: Callable[..., SSHKey], capsys: pytest.CaptureFixture[str]
) -> None:
    gamma = ssh_key_factory("gamma")
    before = node.read_text()

    assert (
        run(["peers", "add", "gamma", gamma.public_line, "https://gamma.example:8701", "--config", str(node)])
        == 0
    )

    after = node.read_text()
    assert _lines_in_order(before, after)
    assert (
        '[peers.gamma]\npublic_key = "' + gamma.public_line + '"\nrelay_url = "https://gamma.example:8701"\n'
        in after
    )
    config = load_config(node)
    assert list(config.peers) == ["beta", "gamma"]
    assert config.peers["gamma"].public_key == gamma.public_line
    assert not config.quorum.enabled
    assert capsys.readouterr().out == (
        f"{node}: peers.gamma added ({fingerprint(gamma.public_line)}, relay https://gamma.example:8701); "
        "2 peers, quorum off.\n"
        "alpha's relay and approver are not running; they read it when they start.\n"
    )
    assert sorted(path.name for path in node.parent.iterdir()) == ["node.toml"]  # no temporary file left


def test_peers_add_reads_the_key_from_a_pub_file_and_turns_the_quorum_on(
    node: Path, ssh_key_factory: Callable[..., SSHKey], capsys: pytest.CaptureFixture[str]
) -> None:
    gamma = ssh_key_factory("gamma")

    code = run(
        [
            "peers",
            "add",
            "gamma",
            str(gamma.public_path),
            "http://127.0.0.1:8707",
            "--config",
            str(node),
            "--quorum",
            "2",
        ]
    )

    assert code == 0
    config = load_config(node)
    assert config.peers["gamma"].public_key == gamma.public_line
    assert config.quorum.enabled
    assert config.quorum.required_approvals == 2
    assert config.quorum.high_risk_patterns == ["shell.*"]  # the user's own patterns stay
    assert "required_approvals = 2\n" in node.read_text()
    # Said as approvals needed from peers, never "2 of 2", which reads as a count of approvals.
    assert "; quorum on, 2 approvals from 2 peers." in capsys.readouterr().out


def test_peers_add_keeps_the_file_mode(node: Path, ssh_key_factory: Callable[..., SSHKey]) -> None:
    node.chmod(0o640)

    assert (
        run(
            [
                "peers",
                "add",
                "gamma",
                ssh_key_factory("gamma").public_line,
                "http://h:1",
                "--config",
                str(node),
            ]
        )
        == 0
    )

    assert stat.S_IMODE(node.stat().st_mode) == 0o640


def test_peers_add_takes_the_configuration_from_the_environment(
    node: Path, ssh_key_factory: Callable[..., SSHKey], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TEAAGENT_CONFIG", str(node))

    assert run(["peers", "add", "gamma", ssh_key_factory("gamma").public_line, "http://h:1"]) == 0

    assert "gamma" in load_config(node).peers


def test_peers_add_refuses_an_existing_peer_unless_replace(
    node: Path, ssh_key_factory: Callable[..., SSHKey], capsys: pytest.CaptureFixture[str]
) -> None:
    before = node.read_bytes()
    delta = ssh_key_factory("delta")

    assert run(["peers", "add", "beta", delta.public_line, "http://h:1", "--config", str(node)]) == 2
    assert capsys.readouterr().err == (
        f"teaagent: {node}: peers.beta already exists: pass --replace to give it this key and URL.\n"
    )
    assert node.read_bytes() == before

    assert (
        run(["peers", "add", "beta", delta.public_line, "http://h:1", "--config", str(node), "--replace"])
        == 0
    )
    assert load_config(node).peers["beta"].public_key == delta.public_line
    assert "[peers.beta]            # the first peer\n" in node.read_text()
    assert capsys.readouterr().out.startswith(f"{node}: peers.beta updated (")


@pytest.mark.parametrize(
    ("arguments", "sentence"),
    [
        (
            ["Gamma", "{gamma}", "http://h:1"],
            "'Gamma' is not a valid agent id: use 1 to 64 lowercase letters, digits, '.', '_' or '-', "
            "starting with a letter or digit.",
        ),
        (
            # urlsplit would drop the newline and read one URL: refused, never mended.
            ["gamma", "{gamma}", "http://h:1\nhttp://h:2"],
            # (shown to the host, never the path or query, where a secret may be)
            "{node}: peers.gamma.relay_url must be an http:// or https:// URL, not 'http://h:1\\nhttp:/…'.",
        ),
        (
            ["gamma", "{gamma}", "http://[::1"],  # urlsplit's own ValueError, never an internal error
            "{node}: peers.gamma.relay_url must be an http:// or https:// URL, not 'http://[::1'.",
        ),
        (
            ["gamma", "{gamma}", "http://h:99999"],  # a port out of range: another ValueError of its own
            "{node}: peers.gamma.relay_url must be an http:// or https:// URL, not 'http://h:99999'.",
        ),
        (
            ["gamma", "{gamma}", "ftp://h:1"],
            "{node}: peers.gamma.relay_url must be an http:// or https:// URL, not 'ftp://h:1'.",
        ),
        (
            ["gamma", "{beta}", "http://h:1"],
            "{node}: peers.beta.public_key and peers.gamma.public_key are the same key, "
            "which would count twice.",
        ),
        (
            ["gamma", "{alpha}", "http://h:1"],
            "{node}: peers.gamma.public_key is this node's own key, which would count this node as a peer.",
        ),
        (
            ["alpha", "{gamma}", "http://h:1"],
            "{node}: peers.alpha is this node itself (agent_id = 'alpha'); "
            "a node cannot approve its own calls.",
        ),
        (
            ["gamma", "{gamma}", "http://h:1", "--quorum", "3"],
            "{node}: quorum.required_approvals is 3 but only 2 peers are configured.",
        ),
    ],
)
def test_peers_add_checks_the_result_with_load_config_and_leaves_the_file_alone(
    node: Path,
    ssh_key_factory: Callable[..., SSHKey],
    capsys: pytest.CaptureFixture[str],
    arguments: list[str],
    sentence: str,
) -> None:
    keys = {name: ssh_key_factory(name).public_line for name in ("alpha", "beta", "gamma")}
    before = node.read_bytes()

    code = run(["peers", "add", *(argument.format(**keys) for argument in arguments), "--config", str(node)])

    assert code == 2
    assert capsys.readouterr().err == f"teaagent: {sentence.format(node=node)}\n"
    assert node.read_bytes() == before
    assert sorted(os.listdir(node.parent)) == ["node.toml"]


def test_peers_add_refuses_a_key_that_is_not_one(node: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = node.read_bytes()

    assert run(["peers", "add", "gamma", "ssh-ed25519 AAAAnotakey", "http://h:1", "--config", str(node)]) == 2

    err = capsys.readouterr().err
    assert err.startswith(
        "teaagent: the key is not a usable SSH public key (a line such as 'ssh-ed25519 AAAA...'): "
    )
    assert err.count("\n") == 1
    assert node.read_bytes() == before


def test_peers_add_never_edits_a_file_that_does_not_load(
    node: Path, ssh_key_factory: Callable[..., SSHKey], capsys: pytest.CaptureFixture[str]
) -> None:
    node.write_text(
        node.read_text().replace("required_approvals = 1", "required_approvals = 1\nthreshold = 2")
    )
    before = node.read_bytes()

    assert (
        run(
            [
                "peers",
                "add",
                "gamma",
                ssh_key_factory("gamma").public_line,
                "http://h:1",
                "--config",
                str(node),
            ]
        )
        == 2
    )

    assert capsys.readouterr().err == f"teaagent: {node}: unknown key quorum.threshold.\n"
    assert node.read_bytes() == before


def test_peers_add_to_a_node_without_peers_makes_the_table(
    tmp_path: Path, ssh_key_factory: Callable[..., SSHKey], capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(["init", str(tmp_path / "alpha")]) == 0
    path = tmp_path / "alpha" / "node.toml"
    before = path.read_text()

    assert (
        run(
            [
                "peers",
                "add",
                "beta",
                ssh_key_factory("beta").public_line,
                "https://beta:8701",
                "--config",
                str(path),
            ]
        )
        == 0
    )
    assert (
        run(
            [
                "peers",
                "add",
                "gamma",
                ssh_key_factory("gamma").public_line,
                "https://gamma:8701",
                "--config",
                str(path),
                "--quorum",
                "2",
            ]
        )
        == 0
    )

    config = load_config(path)
    assert list(config.peers) == ["beta", "gamma"]
    assert (config.quorum.enabled, config.quorum.required_approvals) == (True, 2)
    assert capsys.readouterr().out.endswith(
        "note: permission_mode workspace-write refuses shell.run and fs.delete before the quorum sees them; "
        "--permission-mode danger-full-access leaves them to the peers (allow asks locally too).\n"
        "alpha's relay and approver are not running; they read it when they start.\n"
    )
    beta = ssh_key_factory("beta").public_line
    assert (
        run(
            [
                "peers",
                "add",
                "beta",
                beta,
                "https://beta:8701",
                "--replace",
                "--permission-mode",
                "danger-full-access",
                "--config",
                str(path),
            ]
        )
        == 0
    )
    assert load_config(path).agent.permission_mode == PermissionMode.DANGER_FULL_ACCESS
    assert "note:" not in capsys.readouterr().out
    assert _lines_in_order(
        "\n".join(
            line
            for line in before.splitlines()
            if not line.startswith(("enabled", "required_approvals", "permission_mode"))
        ),
        path.read_text(),
    )


def test_operators_add_lets_an_operator_key_sign_for_the_node_and_peers_list_it(
    tmp_path: Path, ssh_key_factory: Callable[..., SSHKey], capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(["init", "--cluster", "alpha,beta", str(tmp_path)]) == 0
    ana = ssh_key_factory("ana")
    beta_toml = tmp_path / "beta" / "node.toml"
    alpha_toml = tmp_path / "alpha" / "node.toml"
    before = beta_toml.read_text()
    capsys.readouterr()

    assert run(["operators", "add", str(ana.public_path), "--config", str(beta_toml)]) == 0
    assert (
        run(
            [
                "peers",
                "add",
                "beta",
                str(tmp_path / "beta" / "keys" / "beta.pub"),
                load_config(beta_toml).relay_url,
                "--replace",
                "--operator-key",
                ana.public_line,
                "--config",
                str(alpha_toml),
            ]
        )
        == 0
    )

    beta = load_config(beta_toml)
    assert beta.approver.operators == tmp_path / "beta" / "operators.allowed_signers"
    assert [key.line for key in beta.approver.operator_keys] == [ana.public_line]
    assert [key.namespaces for key in beta.approver.operator_keys] == [
        frozenset({"teaagent-approval", "teaagent-denial"})
    ]
    assert _lines_in_order(before, beta_toml.read_text())
    alpha = load_config(alpha_toml)
    beta_pub = (tmp_path / "beta" / "keys" / "beta.pub").read_text().strip()
    assert [key.line for key in alpha.peers["beta"].keys] == [beta_pub, ana.public_line]
    assert capsys.readouterr().out.startswith(
        f"{tmp_path / 'beta' / 'operators.allowed_signers'}: {fingerprint(ana.public_line)} signs for beta; "
    )


def test_operators_add_refuses_a_key_that_already_signs(
    tmp_path: Path, ssh_key_factory: Callable[..., SSHKey], capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(["init", str(tmp_path / "beta")]) == 0
    path = tmp_path / "beta" / "node.toml"
    assert run(["operators", "add", ssh_key_factory("ana").public_line, "--config", str(path)]) == 0
    listed = (tmp_path / "beta" / "operators.allowed_signers").read_bytes()
    capsys.readouterr()

    assert run(["operators", "add", ssh_key_factory("ana").public_line, "--config", str(path)]) == 2
    node_key = str(tmp_path / "beta" / "keys" / "beta.pub")
    assert run(["operators", "add", node_key, "--config", str(path)]) == 2

    assert capsys.readouterr().err == f"teaagent: {path}: that key already signs for beta.\n" * 2
    assert (tmp_path / "beta" / "operators.allowed_signers").read_bytes() == listed


def test_peers_add_replace_without_key_and_url_keeps_them_and_adds_an_operator_key(
    node: Path, ssh_key_factory: Callable[..., SSHKey], capsys: pytest.CaptureFixture[str]
) -> None:
    """The README's `peers add beta --replace --operator-key KEY`: beta keeps its key and relay URL."""
    operator = ssh_key_factory("beta-operator")
    before = load_config(node).peers["beta"]

    assert (
        run(
            [
                "peers",
                "add",
                "beta",
                "--replace",
                "--operator-key",
                operator.public_line,
                "--config",
                str(node),
            ]
        )
        == 0
    )

    after = load_config(node).peers["beta"]
    assert (after.public_key, after.relay_url) == (before.public_key, before.relay_url)
    assert [key.line for key in after.keys][1:] == [operator.public_line]
    assert capsys.readouterr().out.startswith(f"{node}: peers.beta updated (")


@pytest.mark.parametrize("arguments", [["gamma", "--replace"], ["beta"], ["gamma"]])
def test_peers_add_without_key_and_url_needs_replace_on_an_existing_peer(
    node: Path, capsys: pytest.CaptureFixture[str], arguments: list[str]
) -> None:
    before = node.read_bytes()

    assert run(["peers", "add", *arguments, "--config", str(node)]) == 2

    name = arguments[0]
    assert capsys.readouterr().err == (
        f"teaagent: give {name}'s node key and relay URL (teaagent peers add {name} KEY URL); only "
        "--replace on an existing peer keeps them.\n"
    )
    assert node.read_bytes() == before


def _one_sentence(err: str) -> str:
    """A refusal as the user reads it: one line ``teaagent: ...``, no traceback."""
    assert err.startswith("teaagent: "), err
    assert err.count("\n") == 1, err
    assert "Traceback" not in err
    return err[len("teaagent: ") : -1]


def test_peers_add_names_a_key_file_that_does_not_exist(
    node: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(node.parent)
    before = node.read_bytes()

    assert run(["peers", "add", "beta2", "beta.pub", "http://127.0.0.1:8", "--config", str(node)]) == 2

    assert _one_sentence(capsys.readouterr().err) == (
        "the key file beta.pub does not exist; give a public key file (NAME.pub) or the key's line "
        "('ssh-ed25519 AAAA...')."
    )
    assert node.read_bytes() == before


def test_operators_add_refuses_a_private_key_without_showing_it(
    tmp_path: Path, ssh_key_factory: Callable[..., SSHKey], capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(["init", str(tmp_path / "beta")]) == 0
    path = tmp_path / "beta" / "node.toml"
    before = path.read_bytes()
    ana = ssh_key_factory("ana")
    secret = ana.private_path.read_text()
    capsys.readouterr()

    assert run(["operators", "add", str(ana.private_path), "--config", str(path)]) == 2
    from_file = capsys.readouterr()
    assert run(["operators", "add", "--config", str(path), "--", secret]) == 2  # pasted
    pasted = capsys.readouterr()
    assert run(["operators", "add", secret, "--config", str(path)]) == 2  # pasted, read as an option
    as_option = capsys.readouterr()

    assert _one_sentence(from_file.err) == (
        f"{ana.private_path} is a private key; give its public half ({ana.private_path}.pub, or the line "
        f"ssh-keygen -y -f {ana.private_path} prints)."
    )
    assert _one_sentence(pasted.err) == (
        "that is a private key; give its public half "
        "(the .pub file, or the line ssh-keygen -y -f KEY prints)."
    )
    assert _one_sentence(as_option.err) == (
        "an argument is a private key, which is never shown; give its public half (the .pub file)."
    )
    body = [line for line in secret.splitlines() if line and not line.startswith("-----")]
    for captured in (from_file, pasted, as_option):
        assert not any(line in captured.err + captured.out for line in body)
    assert path.read_bytes() == before
    assert not (tmp_path / "beta" / "operators.allowed_signers").exists()


def test_peers_add_says_the_services_read_it_when_they_start_when_none_runs(
    node: Path, ssh_key_factory: Callable[..., SSHKey], capsys: pytest.CaptureFixture[str]
) -> None:
    # The token is in the file, so the services are asked: at two ports held bound, never listened
    # on, so that nothing (another test's service) answers there.
    with socket.socket() as relay, socket.socket() as approver:
        relay.bind(("127.0.0.1", 0))
        approver.bind(("127.0.0.1", 0))
        text = node.read_text().replace("8701", str(relay.getsockname()[1]))
        text = text.replace("port = 8702", f"port = {approver.getsockname()[1]}")
        node.write_text(f'token = "{"t" * 32}"\n' + text)
        gamma = ssh_key_factory("gamma")

        assert (
            run(["peers", "add", "gamma", gamma.public_line, "http://127.0.0.1:9", "--config", str(node)])
            == 0
        )

    assert capsys.readouterr().out.splitlines()[-1] == (
        "alpha's relay and approver are not running; they read it when they start."
    )
