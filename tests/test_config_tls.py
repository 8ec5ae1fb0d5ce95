"""The ``[tls]`` table of node.toml: the relay's certificate and key, and the CA for https:// relays."""

from __future__ import annotations

import ssl
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import SSHKey
from tls_support import PrivateCA

from teaagent.config import TlsSettings, load_config
from teaagent.errors import ConfigError


@pytest.fixture
def write(tmp_path: Path, ssh_key_factory: Callable[..., SSHKey]) -> Callable[..., Path]:
    key = ssh_key_factory("alpha")

    def make(tls: str, relay_url: str = "https://alpha.example:8701") -> Path:
        path = tmp_path / "node.toml"
        path.write_text(
            f'agent_id = "alpha"\nprivate_key = "{key.private_path}"\nrelay_url = "{relay_url}"\n{tls}'
        )
        return path

    return make


@pytest.fixture
def ca(tmp_path: Path) -> PrivateCA:
    return PrivateCA(tmp_path / "tls")


def test_without_a_tls_table_the_relay_is_plain_and_the_public_cas_are_trusted(
    write: Callable[..., Path],
) -> None:
    config = load_config(write("", relay_url="http://127.0.0.1:8701"))

    assert config.tls == TlsSettings()
    assert config.tls.client_verify() is True


def test_cert_key_and_ca_resolve_against_the_configuration_file(
    write: Callable[..., Path], ca: PrivateCA, tmp_path: Path
) -> None:
    files = ca.issue("relay")

    config = load_config(write('[tls]\ncert = "tls/relay.crt"\nkey = "tls/relay.key"\nca = "tls/ca.crt"\n'))

    assert config.tls == TlsSettings(cert=files.cert, key=files.key, ca=tmp_path / "tls" / "ca.crt")
    verify = config.tls.client_verify()
    assert isinstance(verify, ssl.SSLContext)
    assert verify.verify_mode == ssl.CERT_REQUIRED
    assert [cert["subject"] for cert in verify.get_ca_certs()] == [((("commonName", "teaagent test CA"),),)]


def test_a_ca_alone_is_for_a_node_whose_own_relay_is_plain(write: Callable[..., Path], ca: PrivateCA) -> None:
    config = load_config(write('[tls]\nca = "tls/ca.crt"\n', relay_url="http://127.0.0.1:8701"))

    assert config.tls.cert is None
    assert config.tls.ca == ca.cert_path


def test_a_certificate_without_its_key_is_refused(write: Callable[..., Path], ca: PrivateCA) -> None:
    ca.issue("relay")
    path = write('[tls]\ncert = "tls/relay.crt"\n')

    with pytest.raises(ConfigError, match=r": tls\.cert and tls\.key go together: set both, or neither\.$"):
        load_config(path)


def test_a_certificate_on_an_http_relay_url_is_refused(write: Callable[..., Path], ca: PrivateCA) -> None:
    ca.issue("relay")
    path = write('[tls]\ncert = "tls/relay.crt"\nkey = "tls/relay.key"\n', relay_url="http://127.0.0.1:8701")

    with pytest.raises(
        ConfigError,
        match=(
            r": relay_url is 'http://127\.0\.0\.1:8701', but with tls\.cert set the relay serves HTTPS: "
            r"make it an https:// URL\.$"
        ),
    ):
        load_config(path)


def test_a_missing_file_is_named_with_where_it_was_looked_for(
    write: Callable[..., Path], tmp_path: Path
) -> None:
    path = write('[tls]\nca = "tls/missing.crt"\n')

    with pytest.raises(
        ConfigError,
        match=(
            r": tls\.ca names tls/missing\.crt, which does not exist "
            rf"\(looked for {tmp_path}/tls/missing\.crt\)\.$"
        ),
    ):
        load_config(path)


def test_a_key_of_another_certificate_is_refused_when_loaded(
    write: Callable[..., Path], ca: PrivateCA
) -> None:
    ca.issue("one")
    ca.issue("other")
    path = write('[tls]\ncert = "tls/one.crt"\nkey = "tls/other.key"\n')

    with pytest.raises(
        ConfigError,
        match=(
            r": tls\.cert and tls\.key are not a PEM certificate and its private key: "
            r"key values mismatch\.$"
        ),
    ):
        load_config(path)


def test_a_ca_file_that_holds_no_certificate_is_refused(write: Callable[..., Path], tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("not a certificate\n")
    path = write('[tls]\nca = "notes.txt"\n')

    with pytest.raises(ConfigError, match=r": tls\.ca names notes\.txt, which holds no PEM CA certificate: "):
        load_config(path)


def test_an_unknown_key_of_the_tls_table_is_refused(write: Callable[..., Path]) -> None:
    path = write('[tls]\ncertificate = "relay.crt"\n')

    with pytest.raises(ConfigError, match=r": unknown key tls\.certificate"):
        load_config(path)
