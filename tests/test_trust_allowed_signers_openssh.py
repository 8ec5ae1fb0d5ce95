"""``allowed_signers`` as OpenSSH reads it (PROTOCOL.md "Keys of a peer"): ``ssh-keygen`` is the reference.

Every row of the table is an ``allowed_signers`` text, a namespace, a verify time and a time zone.
The real ``ssh-keygen -Y verify -I beta`` decides whether beta's key may sign there and then, and
teaagent (:func:`parse_allowed_signers` for beta, then :func:`signing_key`) must decide the same;
``ssh-keygen -Y match-principals`` and ``-Y find-principals`` hold the principal matching and the
key's validity to the same answers. The rows cover OpenSSH's pattern lists (negations, ``?``,
``[`` as a literal, commas, quotes), namespaces that are prefixes of one another, each validity
boundary to the second, local times in zones with summer time and with half hours, and one key
on two lines.
"""

from __future__ import annotations

import calendar
import contextlib
import os
import re
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import SSHKey

from teaagent.errors import SignatureError
from teaagent.quorum import signing_key
from teaagent.trust import SignerKey, parse_allowed_signers

APPROVAL = "teaagent-approval"
NAMESPACES = (APPROVAL, "teaagent-approva", "teaagent-approval-x", "teaagent-request", "teaagent-denial")
DATA = b'{"type":"teaagent.approval","signer":"beta"}'
INSIDE = "20300115000000"  # a time inside every validity of the table's lines
NEW_YORK = "America/New_York"  # summer time: OpenSSH reads a local time as standard time all year
KOLKATA = "Asia/Kolkata"  # UTC+05:30, no summer time


@dataclass(frozen=True)
class Material:
    """beta's key (made by ssh-keygen), another key, and beta's signatures over DATA per namespace."""

    folder: Path
    key: SSHKey
    other: SSHKey
    signatures: dict[str, Path]


@pytest.fixture(scope="module")
def material(tmp_path_factory: pytest.TempPathFactory, ssh_key_factory: Callable[..., SSHKey]) -> Material:
    folder = tmp_path_factory.mktemp("allowed-signers")
    key = ssh_key_factory("table-beta")
    other = ssh_key_factory("table-other")
    signatures: dict[str, Path] = {}
    for namespace in NAMESPACES:
        data = folder / f"data-{namespace}"
        data.write_bytes(DATA)
        subprocess.run(
            ["ssh-keygen", "-q", "-Y", "sign", "-f", str(key.private_path), "-n", namespace, str(data)],
            check=True,
            capture_output=True,
        )
        signatures[namespace] = data.with_name(data.name + ".sig")
    (folder / "data").write_bytes(DATA)
    return Material(folder, key, other, signatures)


@contextlib.contextmanager
def time_zone(zone: str) -> Iterator[None]:
    """``TZ`` for this process's ``mktime`` (teaagent reads local times with it), restored after."""
    before = os.environ.get("TZ")
    os.environ["TZ"] = zone
    time.tzset()
    try:
        yield
    finally:
        if before is None:
            del os.environ["TZ"]
        else:
            os.environ["TZ"] = before
        time.tzset()


def utc(stamp: str) -> int:
    """``YYYYMMDDHHMMSS`` in UTC as Unix seconds."""
    return calendar.timegm(time.strptime(stamp, "%Y%m%d%H%M%S"))


def ssh_keygen(*arguments: str, zone: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        ["ssh-keygen", *arguments],
        input=stdin,
        capture_output=True,
        check=False,
        env={**os.environ, "TZ": zone},
    )


def row(
    name: str, lines: str, namespace: str = APPROVAL, at: str = INSIDE, zone: str = "UTC"
) -> pytest.ParameterSet:
    return pytest.param(lines, namespace, at, zone, id=name)


VALIDITY = 'valid-after="20300101000000Z",valid-before="20300201000000Z"'
TABLE = [
    # -- principals: OpenSSH's match_pattern_list ----------------------------------------------------
    row("plain", "beta {k}"),
    row("another-principal", "alpha {k}"),
    row("case-matters", "Beta {k}"),
    row("list", "alpha,beta,gamma {k}"),
    row("list-without-beta", "alpha,gamma {k}"),
    row("trailing-comma", "beta, {k}"),
    row("empty-subpattern", ",beta {k}"),
    row("star", "* {k}"),
    row("star-suffix", "b* {k}"),
    row("star-inside", "b*a {k}"),
    row("question-mark", "b?ta {k}"),
    row("question-mark-too-many", "beta? {k}"),
    row("bracket-is-literal", "[b]eta {k}"),
    row("bracket-class-is-literal", "[a-z]eta {k}"),
    row("star-but-not-beta", "*,!beta {k}"),
    row("not-beta-then-star", "!beta,* {k}"),
    row("beta-and-not-beta", "beta,!beta {k}"),
    row("negated-pattern", "*,!b?ta {k}"),
    row("star-but-not-gamma", "*,!gamma {k}"),
    row("only-a-negation", "!gamma {k}"),
    row("quoted", '"beta" {k}'),
    row("quoted-list", '"alpha,beta" {k}'),
    row("quoted-with-a-space", '"alpha, beta" {k}'),
    row("quoted-negation", '"*,!beta" {k}'),
    # -- namespaces: also a pattern list, never a prefix ---------------------------------------------
    row("namespace", f'beta namespaces="{APPROVAL}" {{k}}'),
    row("namespace-prefix-of-it", f'beta namespaces="{APPROVAL}" {{k}}', "teaagent-approva"),
    row("namespace-it-is-a-prefix-of", f'beta namespaces="{APPROVAL}" {{k}}', "teaagent-approval-x"),
    row("namespace-other", f'beta namespaces="{APPROVAL}" {{k}}', "teaagent-denial"),
    row("namespaces-list", 'beta namespaces="teaagent-request,teaagent-approval" {k}'),
    row("namespaces-list-with-a-space", 'beta namespaces="teaagent-request, teaagent-approval" {k}'),
    row("namespaces-star", 'beta namespaces="teaagent-*" {k}'),
    row("namespaces-star-prefix", 'beta namespaces="teaagent-approva*" {k}', "teaagent-approval-x"),
    row("namespaces-question-mark", 'beta namespaces="teaagent-appr?val" {k}'),
    row("namespaces-negated", 'beta namespaces="teaagent-*,!teaagent-denial" {k}', "teaagent-denial"),
    row("namespaces-negated-other", 'beta namespaces="teaagent-*,!teaagent-denial" {k}'),
    row("namespaces-empty", 'beta namespaces="" {k}'),
    row("option-name-in-capitals", f'beta NAMESPACES="{APPROVAL}" {{k}}'),
    row("options-together", f'beta namespaces="{APPROVAL}",valid-before="20300201Z" {{k}}'),
    # -- validity, UTC: each boundary to the second ---------------------------------------------------
    row("valid-after-minus-1", f"beta {VALIDITY} {{k}}", at="20291231235959"),
    row("valid-after", f"beta {VALIDITY} {{k}}", at="20300101000000"),
    row("valid-after-plus-1", f"beta {VALIDITY} {{k}}", at="20300101000001"),
    row("valid-before-minus-1", f"beta {VALIDITY} {{k}}", at="20300131235959"),
    row("valid-before", f"beta {VALIDITY} {{k}}", at="20300201000000"),
    row("valid-before-plus-1", f"beta {VALIDITY} {{k}}", at="20300201000001"),
    row("valid-before-date", 'beta valid-before="20300201" {k}', at="20300201000000"),
    row("valid-before-date-plus-1", 'beta valid-before="20300201" {k}', at="20300201000001"),
    row("valid-before-utc-suffix", 'beta valid-before="20300201000000utc" {k}', at="20300201000000"),
    row("valid-before-utc-suffix-plus-1", 'beta valid-before="20300201000000UTC" {k}', at="20300201000001"),
    row("valid-before-lowercase-z-plus-1", 'beta valid-before="203002010000z" {k}', at="20300201000001"),
    # -- validity, local time: New York in summer (OpenSSH reads it as standard time) and winter -----
    *(
        row(
            f"new-york-summer-{stamp}",
            'beta valid-after="20300701120000" {k}',
            at=stamp,
            zone=NEW_YORK,
        )
        for stamp in ("20300701155959", "20300701160000", "20300701165959", "20300701170000")
    ),
    *(
        row(
            f"new-york-winter-{stamp}",
            'beta valid-before="203001151200" {k}',
            at=stamp,
            zone=NEW_YORK,
        )
        for stamp in ("20300115165959", "20300115170000", "20300115170001")
    ),
    *(
        row(f"new-york-date-{stamp}", 'beta valid-before="20300702" {k}', at=stamp, zone=NEW_YORK)
        for stamp in ("20300702040000", "20300702045959", "20300702050000", "20300702050001")
    ),
    *(
        row(f"kolkata-{stamp}", 'beta valid-after="20300101000000" {k}', at=stamp, zone=KOLKATA)
        for stamp in ("20291231182959", "20291231183000", "20300101000000")
    ),
    row(
        "kolkata-z-is-utc",
        'beta valid-before="20300101000000Z" {k}',
        at="20300101000001",
        zone=KOLKATA,
    ),
    # -- one key on two lines: any line that allows it will do --------------------------------------
    row(
        "two-lines-namespaces",
        'beta namespaces="teaagent-request" {k}\nbeta namespaces="teaagent-approval" {k}',
    ),
    row(
        "two-lines-namespaces-neither",
        'beta namespaces="teaagent-request" {k}\nbeta namespaces="teaagent-denial" {k}',
    ),
    *(
        row(
            f"two-lines-validity-{stamp}",
            'beta valid-before="20300101000000Z" {k}\nbeta valid-after="20300201000000Z" {k}',
            at=stamp,
        )
        for stamp in ("20291231000000", "20300115000000", "20300301000000")
    ),
    row("two-lines-negated-then-plain", "*,!beta {k}\nbeta {k}"),
    row("two-lines-other-principal-then-beta", "alpha {k}\nbeta {k}"),
    row("another-key", "beta {o}"),
    row("another-key-then-beta", f'beta {{o}}\nbeta namespaces="{APPROVAL}" {{k}}'),
]


def teaagent_accepts(text: str, signature: str, namespace: str, at: int) -> bool:
    try:
        keys = parse_allowed_signers(text, principal="beta", source="allowed_signers")
    except ValueError:
        return False  # the configuration is refused when it loads: nothing is accepted
    try:
        signing_key(DATA, signature, keys, namespace, at, whose="the keys of beta")
    except SignatureError:
        return False
    return True


@pytest.mark.parametrize(("lines", "namespace", "at", "zone"), TABLE)
def test_teaagent_accepts_exactly_what_ssh_keygen_accepts(
    material: Material, lines: str, namespace: str, at: str, zone: str
) -> None:
    text = lines.format(k=material.key.public_line, o=material.other.public_line) + "\n"
    allowed = material.folder / "allowed_signers"
    allowed.write_text(text)
    signature_path = material.signatures[namespace]
    when = f"-Overify-time={at}Z"
    verified = ssh_keygen(
        "-Y", "verify", "-f", str(allowed), "-I", "beta", "-n", namespace, "-s", str(signature_path), when,
        zone=zone, stdin=DATA,
    )  # fmt: skip
    matched = ssh_keygen("-Y", "match-principals", "-I", "beta", "-f", str(allowed), zone=zone)
    found = ssh_keygen(
        "-Y", "find-principals", "-f", str(allowed), "-s", str(signature_path), when, zone=zone
    )
    with time_zone(zone):
        accepted = teaagent_accepts(text, signature_path.read_text(), namespace, utc(at))
        try:
            listed = parse_allowed_signers(text, principal="beta", source="allowed_signers")
        except ValueError:
            listed = ()
    assert accepted == (verified.returncode == 0), verified.stderr.decode()
    # Principals alone: beta is given a line exactly when OpenSSH matches beta on one.
    assert bool(listed) == (matched.returncode == 0), matched.stderr.decode()
    # A signature teaagent accepts is by a key OpenSSH finds valid for someone at that time.
    assert not accepted or found.returncode == 0, found.stderr.decode()


# -- the sentences of a refusal ---------------------------------------------------------------------


def exactly(message: str) -> str:
    return f"^{re.escape(message)}$"


def test_a_key_on_two_lines_that_neither_allow_is_refused_in_one_sentence(material: Material) -> None:
    text = (
        f'beta namespaces="teaagent-request" {material.key.public_line}\n'
        f'beta valid-before="20300101Z" {material.key.public_line}\n'
    )
    keys = parse_allowed_signers(text, principal="beta", source="ops")
    signature = material.signatures[APPROVAL].read_text()
    fingerprint = keys[0].fingerprint
    message = (
        f"the key {fingerprint} is listed 2 times and no entry allows this signature: at ops:1 it may "
        "sign only in teaagent-request, not in teaagent-approval; at ops:2 it was valid only until "
        "2030-01-01 00:00:00 UTC."
    )
    with pytest.raises(SignatureError, match=exactly(message)):
        signing_key(DATA, signature, keys, APPROVAL, utc(INSIDE), whose="the keys of beta")
    # Beside another key of beta's, still one sentence, naming the entries of the key that signed.
    other = SignerKey(line=material.other.public_line, source="peers.beta.public_key")
    with pytest.raises(SignatureError, match=exactly(message)):
        signing_key(DATA, signature, (other, *keys), APPROVAL, utc(INSIDE), whose="the keys of beta")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            'namespaces="a",namespaces="b"',
            "ops:1: the option namespaces is given twice.",
        ),
        (
            'valid-after="20300201Z",valid-before="20300101Z"',
            "ops:1: valid-before is not later than valid-after.",
        ),
        ('valid-before="19700101Z"', "ops:1: the time '19700101Z' is not after 1970-01-01 00:00:00 UTC."),
    ],
)
def test_a_line_openssh_refuses_is_refused_with_one_sentence(
    material: Material, options: str, message: str
) -> None:
    text = f"beta {options} {material.key.public_line}\n"
    allowed = material.folder / "refused_signers"
    allowed.write_text(text)
    signature_path = material.signatures[APPROVAL]
    verified = ssh_keygen(
        "-Y", "verify", "-f", str(allowed), "-I", "beta", "-n", APPROVAL, "-s", str(signature_path),
        f"-Overify-time={INSIDE}Z", zone="UTC", stdin=DATA,
    )  # fmt: skip
    assert verified.returncode != 0
    with pytest.raises(ValueError, match=exactly(message)):
        parse_allowed_signers(text, principal="beta", source="ops")
