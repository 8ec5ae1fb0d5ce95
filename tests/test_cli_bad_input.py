"""A user's mistake on the command line: exit 2 and one sentence on stderr, never an internal error.

Each case is a mistake that once ended in Python's own exception (``internal error: RuntimeError``,
``RecursionError``, ``NotADirectoryError``, ``OSError``...) and exit 1, or was taken without a word
(a port out of range served on another port, ``--required -5`` written into node.toml, a
``--database`` that is a file passed over).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from teaagent.cli._main import run
from teaagent.signing import SSHPrivateKey

NOBODY = "~nobody-teaagent-knows"  # a user no machine has: expanduser cannot find a home for it
DEEP = "[" * 20_000 + "]" * 20_000  # far deeper than Python's recursion limit, within every size limit
LONG_INTEGER = '{"n": ' + "1" * 5000 + "}"  # more digits than Python converts to an int
OPERATOR_LINE = SSHPrivateKey.from_cryptography(Ed25519PrivateKey.generate()).public_key.to_line()


@pytest.fixture
def node(tmp_path: Path) -> Path:
    """One node made by ``teaagent init``: its node.toml."""
    assert run(["init", str(tmp_path / "alpha"), "--name", "alpha"]) == 0
    return tmp_path / "alpha" / "node.toml"


def _replace(config: Path, old: str, new: str) -> None:
    text = config.read_text()
    assert old in text
    config.write_text(text.replace(old, new, 1))


def _file(tmp_path: Path, name: str, data: str | bytes) -> str:
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, bytes):
        path.write_bytes(data)
    else:
        path.write_text(data)
    return str(path)


Case = Callable[[Path, Path], list[str]]  # (node.toml, a scratch folder) -> the arguments

CASES: dict[str, tuple[Case, str]] = {
    "config under an unknown user's home": (
        lambda node, tmp: ["keys", "fingerprint", "--config", f"{NOBODY}/node.toml"],
        f"this machine knows no home directory for {NOBODY}.",
    ),
    "private_key under an unknown user's home": (
        lambda node, tmp: (
            _replace(node, 'private_key = "keys/alpha"', f'private_key = "{NOBODY}/alpha"')
            or ["keys", "fingerprint", "--config", str(node)]
        ),
        f"this machine knows no home directory for {NOBODY}.",
    ),
    "init under an unknown user's home": (
        lambda node, tmp: ["init", f"{NOBODY}/beta", "--name", "beta"],
        f"this machine knows no home directory for {NOBODY}.",
    ),
    "peer key file under an unknown user's home": (
        lambda node, tmp: ["peers", "add", "beta", f"{NOBODY}/beta.pub", "http://h:1", "--config", str(node)],
        f"this machine knows no home directory for {NOBODY}.",
    ),
    "arguments nested too deep": (
        lambda node, tmp: ["tools", "call", "fs.read", DEEP, "--config", str(node)],
        "The arguments object nests arrays and objects more than 64 levels deep.",
    ),
    "arguments with an integer too long": (
        lambda node, tmp: ["tools", "call", "fs.read", LONG_INTEGER, "--config", str(node)],
        "The arguments hold an integer of more than 4300 digits.",
    ),
    "certificate nested too deep": (
        lambda node, tmp: ["quorum", "verify", _file(tmp, "deep.json", DEEP), "--config", str(node)],
        "the certificate is not valid JSON.",
    ),
    "certificate with an integer too long": (
        lambda node, tmp: ["quorum", "verify", _file(tmp, "long.json", LONG_INTEGER), "--config", str(node)],
        "the certificate is not valid JSON.",
    ),
    "statement file nested too deep": (
        lambda node, tmp: [
            "approvals",
            "submit",
            "0" * 32,
            "--statement",
            _file(tmp, "deep-statement.json", DEEP),
            "--signature",
            _file(tmp, "statement.sig", "x"),
            "--config",
            str(node),
        ],
        "deep-statement.json is not JSON.",
    ),
    "script nested too deep": (
        lambda node, tmp: ["run", "do it", "--script", _file(tmp, "deep.json", DEEP), "--config", str(node)],
        "The script ",
    ),
    "session file nested too deep": (
        lambda node, tmp: (
            _file(node.parent / "workspace" / ".teaagent" / "sessions", "s1.json", DEEP)
            and ["run", "do it", "--session", "s1", "--config", str(node)]
        ),
        "s1.json is not valid JSON (The JSON document nests arrays and objects more than 64 levels deep.)",
    ),
    "origin key that is no key": (
        lambda node, tmp: [
            "quorum",
            "verify",
            _file(tmp, "cert.json", "{}"),
            "--origin-key",
            "garbage",
            "--config",
            str(node),
        ],
        "--origin-key is not an SSH public key line: ",
    ),
    "workspace that is a file": (
        lambda node, tmp: (
            _replace(node, 'workspace = "workspace"', 'workspace = "node.toml"')
            or ["tools", "list", "--config", str(node)]
        ),
        "is not a directory",
    ),
    "init into a file": (
        lambda node, tmp: ["init", _file(tmp, "afile", ""), "--name", "beta"],
        "afile cannot be made a folder: File exists.",
    ),
    "init under a file": (
        lambda node, tmp: ["init", _file(tmp, "afile", "") + "/beta"],
        "afile/beta cannot be made a folder: Not a directory.",
    ),
    "demo under a file": (
        lambda node, tmp: ["demo", "--dir", _file(tmp, "afile", "") + "/demo"],
        "afile/demo cannot be made a folder: Not a directory.",
    ),
    "tui database that is a file": (
        lambda node, tmp: ["tui", "--database", _file(tmp, "afile", ""), "--config", str(node)],
        "afile is a file; give the folder whose .teaagent/ keeps the sessions.",
    ),
    "peer key longer than a file name": (
        lambda node, tmp: ["peers", "add", "beta", "A" * 300, "http://127.0.0.1:9000", "--config", str(node)],
        "does not exist; give a public key file (NAME.pub) or the key's line ('ssh-ed25519 AAAA...').",
    ),
    "private_key longer than a file name": (
        lambda node, tmp: (
            _replace(node, 'private_key = "keys/alpha"', f'private_key = "{"k" * 300}"')
            or ["keys", "fingerprint", "--config", str(node)]
        ),
        "does not exist (looked for ",
    ),
    "operators' file that is not text": (
        lambda node, tmp: (
            _file(node.parent, "operators.allowed_signers", b"\xff\xfe\x00")
            and ["operators", "add", OPERATOR_LINE, "--config", str(node)]
        ),
        "operators.allowed_signers cannot be read: it is not utf-8 text.",
    ),
    "bench seconds not a number": (
        lambda node, tmp: ["bench", "quorum", "--seconds", "nan"],
        "--seconds must be a positive number of seconds, not nan.",
    ),
    "bench seconds infinite": (
        lambda node, tmp: ["bench", "quorum", "--seconds", "inf"],
        "--seconds must be a positive number of seconds, not inf.",
    ),
    "required approvals below one": (
        lambda node, tmp: ["init", str(tmp / "beta"), "--name", "beta", "--required", "-5"],
        "--required -5 is not a number of approvals: give 1 or more.",
    ),
    "host with a path": (
        lambda node, tmp: ["init", str(tmp / "beta"), "--name", "beta", "--host", "a/b"],
        "--host 'a/b' does not make a usable relay URL (http://a/b:",
    ),
    "host with a tab": (
        lambda node, tmp: ["init", str(tmp / "beta"), "--name", "beta", "--host", "a\tb"],
        "--host 'a\\tb' does not make a usable relay URL",
    ),
    "tool pattern longer than the approver takes": (
        lambda node, tmp: ["approvals", "list", "--tool", "x" * 300, "--config", str(node)],
        "--tool is a pattern of at most 256 characters, not 300.",
    ),
    "tool pattern to watch longer than the approver takes": (
        lambda node, tmp: ["approvals", "watch", "--tool", "x" * 300, "--config", str(node)],
        "--tool is a pattern of at most 256 characters, not 300.",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_mistake_exits_2_with_one_sentence(
    case: str, node: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    arguments, expected = CASES[case]
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    argv = arguments(node, scratch)
    capsys.readouterr()

    code = run(argv)

    err = capsys.readouterr().err
    assert (code, err.count("\n")) == (2, 1), err
    assert err.startswith("teaagent: "), err
    assert "internal error" not in err
    assert expected in err, err
    assert not (scratch / "beta" / "node.toml").exists()  # an init refused writes nothing
