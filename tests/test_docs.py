"""The documentation tells the truth about the code and points only at what the repository holds.

- docs/protocol.md's worked examples are made again by the code (tests/docs_examples.py) and must
  be the page's bytes; its approval verifies with OpenSSH's own ``ssh-keygen -Y verify``, and its
  certificate with ``verify_certificate``.
- Every relative link and every repository path named in README.md and docs/*.md exists.
- docs/configuration.md names every key the configuration loader accepts.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from docs_examples import CREATED_AT, examples, key

from teaagent.config import _agent_tables, _load, _peer_tables, _service_tables
from teaagent.policy import MultiSigQuorumConfig
from teaagent.quorum import verify_certificate

ROOT = Path(__file__).resolve().parent.parent
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [ROOT / "README.md", *DOCS]
PROTOCOL = ROOT / "docs" / "protocol.md"
EXAMPLE = re.compile(r"<!-- example: ([a-z0-9-]+) -->\n```\n(.*?)\n```", re.DOTALL)


def _page_examples() -> dict[str, str]:
    return dict(EXAMPLE.findall(PROTOCOL.read_text()))


def test_the_docs_folder_holds_the_promised_pages() -> None:
    names = {page.name for page in DOCS}
    assert {"configuration.md", "protocol.md", "architecture.md", "llm.md", "deployment.md"} <= names


def test_every_worked_example_is_what_the_code_makes() -> None:
    made = examples()
    on_page = _page_examples()

    assert set(on_page) == set(made)
    for name, text in made.items():
        assert on_page[name] == text, (
            f"docs/protocol.md example {name!r} is stale: run python tests/docs_examples.py"
        )


def test_the_examples_approval_verifies_with_ssh_keygen(tmp_path: Path) -> None:
    page = _page_examples()
    statement = tmp_path / "approval.json"
    statement.write_bytes(page["approval-bytes"].encode())  # no trailing newline: the exact bytes
    body = page["approval-signature"]
    lines = [body[i : i + 70] for i in range(0, len(body), 70)]
    signature = tmp_path / "approval.json.sig"
    signature.write_text(
        "-----BEGIN SSH SIGNATURE-----\n" + "\n".join(lines) + "\n-----END SSH SIGNATURE-----\n"
    )
    allowed = tmp_path / "allowed_signers"
    allowed.write_text(f"beta {key('beta').public_key.to_line()}\n")

    def verify(namespace: str, data: Path) -> subprocess.CompletedProcess[str]:
        with data.open("rb") as stdin:
            return subprocess.run(
                [
                    "ssh-keygen",
                    "-Y",
                    "verify",
                    "-n",
                    namespace,
                    "-I",
                    "beta",
                    "-f",
                    str(allowed),
                    "-s",
                    str(signature),
                ],
                stdin=stdin,
                capture_output=True,
                text=True,
                check=False,
            )

    good = verify("teaagent-approval", statement)
    assert good.returncode == 0, good.stderr
    assert verify("teaagent-denial", statement).returncode != 0  # the namespace is signed
    tampered = tmp_path / "tampered.json"
    tampered.write_bytes(page["approval-bytes"].replace('"beta"', '"gamma"').encode())
    assert verify("teaagent-approval", tampered).returncode != 0


def test_the_examples_certificate_verifies_and_counts_beta_and_gamma() -> None:
    certificate = json.loads(_page_examples()["certificate"])
    config = MultiSigQuorumConfig(
        enabled=True,
        required_approvals=2,
        peer_agent_ids=["beta", "gamma", "delta"],
        peer_public_keys={name: key(name).public_key.to_line() for name in ("beta", "gamma", "delta")},
        peer_relay_urls={name: f"https://{name}.example:8701" for name in ("beta", "gamma", "delta")},
        high_risk_patterns=["shell.*"],
    )

    verified = verify_certificate(
        certificate, config, origin_public_key=key("alpha").public_key.to_line(), now=CREATED_AT + 10
    )

    assert sorted(verified.signers) == ["beta", "gamma"]


# -- links ---------------------------------------------------------------------------------------

MARKDOWN_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
# Paths of the repository named in text: `docs/x.md`, `tests/test_x.py`, `deploy/Dockerfile`...
CODE_PATH = re.compile(
    r"`((?:\.\./)?(?:docs|tests|deploy|libs|services|\.ci)/[A-Za-z0-9_./{},-]+"
    r"|[A-Za-z0-9_-]+\.(?:md|toml|yml|yaml|py)|Makefile|Dockerfile)`"
)
NOT_OURS = {"node.toml", "alpha.toml", "beta.toml", "gamma.toml", "CERT.json", "certificate.json"}


def _mentions(page: Path) -> set[str]:
    text = page.read_text()
    found: set[str] = set()
    for target in MARKDOWN_LINK.findall(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # a URL (http:, mailto:) or an anchor of the page itself
        found.add(target.split("#", 1)[0])
    for path in CODE_PATH.findall(text):
        if path in NOT_OURS or "{" in path or path.startswith(("/", "~")):
            continue
        found.add(path)
    return found


def _exists(page: Path, mention: str) -> bool:
    # A relative link resolves against its page; a bare path in text is the repository's.
    return (page.parent / mention).exists() or (ROOT / mention).exists()


@pytest.mark.parametrize("page", PAGES, ids=[page.relative_to(ROOT).as_posix() for page in PAGES])
def test_every_file_a_page_points_at_exists(page: Path) -> None:
    missing = sorted(mention for mention in _mentions(page) if not _exists(page, mention))

    assert missing == [], f"{page.relative_to(ROOT)} points at files the repository does not hold"


def test_the_link_check_sees_links_and_paths(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "[here](docs/protocol.md#counting) [web](https://example.org) [gone](docs/nowhere.md)\n"
        "see `tests/test_docs.py` and `deploy/missing.sh`; `node.toml` is the user's\n"
    )

    mentions = _mentions(page)

    assert mentions == {"docs/protocol.md", "docs/nowhere.md", "tests/test_docs.py", "deploy/missing.sh"}
    assert [m for m in sorted(mentions) if not _exists(page, m)] == ["deploy/missing.sh", "docs/nowhere.md"]


# -- the configuration reference -------------------------------------------------------------------


def test_the_configuration_reference_names_every_key_the_loader_takes() -> None:
    text = (ROOT / "docs" / "configuration.md").read_text()
    tables = {
        "": _load.ROOT_KEYS,
        "agent.": _agent_tables.AGENT_KEYS,
        "quorum.": _peer_tables.QUORUM_KEYS,
        "peers.NAME.": _peer_tables.PEER_KEYS,
        "approver.": _service_tables.APPROVER_KEYS,
        "approver.notify.": _service_tables.NOTIFY_KEYS,
        "approver.rules[].": _service_tables.RULE_KEYS,
        "agent.rate_limits.TOOL.": _agent_tables.RATE_LIMIT_KEYS,
        "models.NAME.": _agent_tables.MODEL_KEYS,
        "tls.": _service_tables.TLS_KEYS,
    }
    missing = [
        prefix + name for prefix, keys in tables.items() for name in keys if f"`{prefix}{name}`" not in text
    ]

    assert missing == []
