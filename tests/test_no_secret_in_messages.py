"""A secret a URL carries never reaches a message: refusals, errors, logs, ``repr``.

A URL may hold a password (``redis://:PW@host``, ``?password=PW``, which redis-py takes), a
proxy's credentials (``https://user:PW@proxy``) or a token in its path (a Slack webhook's). A
refused URL is shown to its host (:func:`teaagent._urls.shown_url`), a Redis URL with its
passwords masked (:func:`teaagent.store.redact_url`), and a relay's URL may hold no credentials.
"""

from __future__ import annotations

import logging
import socket
from pathlib import Path

import pytest

from teaagent._urls import shown_url
from teaagent.cli._main import run
from teaagent.config import load_config
from teaagent.errors import ConfigError, RelayError, StoreError
from teaagent.llm import create_llm_adapter
from teaagent.relay_client import RelayClient
from teaagent.store import StoreOptions, connect_sync, redact_url
from teaagent.trust import MultiSigQuorumConfig

SECRET = "S3CRETPW"
FAST_FAIL = StoreOptions(socket_timeout=2.0, connect_timeout=2.0, retries=0)


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def node(tmp_path: Path) -> Path:
    assert run(["init", str(tmp_path / "alpha"), "--name", "alpha"]) == 0
    return tmp_path / "alpha" / "node.toml"


def _set(config: Path, key: str, value: str) -> None:
    lines = config.read_text().splitlines()
    index = next(i for i, line in enumerate(lines) if line.startswith(f"{key} = "))
    lines[index] = f'{key} = "{value}"'
    config.write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (f"reddis://:{SECRET}@host:6379/0", "reddis://host:6379/…"),
        (f"hooks.slack.com/services/T0001/B0002/{SECRET}", "hooks.slack.com/…"),
        (f"https://user:{SECRET}@hooks.example:99999/x", "https://hooks.example:99999/…"),
        (f"redis://127.0.0.1/0?password={SECRET}", "redis://127.0.0.1/…"),
        ("http://[::1", "http://[::1"),  # no parser reads it: shown as text all the same
        ("ftp://relay", "ftp://relay"),
    ],
)
def test_a_url_is_shown_to_its_host_never_its_credentials_path_or_query(url: str, shown: str) -> None:
    assert shown_url(url) == shown


@pytest.mark.parametrize(
    ("url", "redacted"),
    [
        (f"redis://127.0.0.1:1/0?password={SECRET}", "redis://127.0.0.1:1/0?password=***"),
        (f"unix:///run/redis.sock?db=0&password={SECRET}", "unix:///run/redis.sock?db=0&password=***"),
        (
            f"redis://user:{SECRET}@[::1]:7000/0?Password={SECRET}&db=1",
            "redis://user:***@[::1]:7000/0?Password=***&db=1",
        ),
        (f"redis://:{SECRET}@host:63a79/0", "redis://host:63a79/…"),  # a port urlsplit refuses
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
    ],
)
def test_a_redis_url_is_redacted_of_every_password_it_holds(url: str, redacted: str) -> None:
    assert redact_url(url) == redacted


def test_a_password_in_a_redis_urls_query_never_reaches_the_error_or_the_repr() -> None:
    store = connect_sync(
        f"redis://127.0.0.1:{closed_port()}/0?password={SECRET}", prefix="ta:alpha", options=FAST_FAIL
    )
    try:
        with pytest.raises(StoreError) as caught:
            store.ping()
    finally:
        store.close()
    assert "is unreachable" in str(caught.value)
    assert SECRET not in str(caught.value)
    assert SECRET not in repr(store)


@pytest.mark.parametrize(
    ("key", "value", "says"),
    [
        ("redis_url", f"reddis://:{SECRET}@host:6379/0", "redis_url must be"),
        ("redis_url", f"redis://:{SECRET}@host:63a79/0", "redis_url must be"),
        ("relay_url", f"http://relay:{SECRET}@127.0.0.1:8701", "relay_url must not hold a user or password"),
        ("relay_url", f"http:/127.0.0.1:8701/{SECRET}", "relay_url must be an http:// or https:// URL"),
    ],
)
def test_a_refused_url_in_node_toml_is_named_without_its_secret(
    node: Path, key: str, value: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _set(node, key, value)

    assert run(["keys", "fingerprint", "--config", str(node)]) == 2

    err = capsys.readouterr().err
    assert says in err
    assert SECRET not in err


def test_a_webhook_url_without_its_scheme_is_refused_without_its_token(node: Path) -> None:
    text = node.read_text()
    node.write_text(
        text + f'\n[approver.notify]\nwebhook_url = "hooks.slack.com/services/T0001/B0002/{SECRET}"\n'
    )
    with pytest.raises(ConfigError) as refused:
        load_config(node)
    assert "webhook_url must be an http:// or https:// URL, not 'hooks.slack.com/…'" in str(refused.value)
    assert SECRET not in str(refused.value)


@pytest.mark.anyio
async def test_a_reload_that_refuses_a_url_logs_it_without_its_secret(
    node: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from teaagent._reload import TrustReloader

    reloader = TrustReloader(load_config(node), what="the approver of alpha")
    text = node.read_text()
    node.write_text(text + f'\n[approver.notify]\nwebhook_url = "https://user:{SECRET}@:99999/x"\n')
    with caplog.at_level(logging.DEBUG):
        await reloader.reload("SIGHUP")
    assert "kept its trust" in caplog.text
    assert SECRET not in caplog.text


def test_init_names_a_refused_redis_url_without_its_password(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        run(["init", str(tmp_path / "beta"), "--name", "beta", "--redis-url", f"redis://:{SECRET}@h:63a79/0"])
        == 2
    )
    err = capsys.readouterr().err
    assert "--redis-url must be" in err
    assert SECRET not in err


def test_an_llm_base_url_is_refused_without_its_credentials() -> None:
    environ = {"OPENAI_API_KEY": "sk-test", "OPENAI_BASE_URL": f"htps://proxy:{SECRET}@llm.example/v1"}
    with pytest.raises(ConfigError) as from_env:
        create_llm_adapter("openai", environ=environ)
    with pytest.raises(ConfigError) as given:
        create_llm_adapter(
            "openai", environ={"OPENAI_API_KEY": "sk-test"}, base_url=f"htps://p:{SECRET}@x/v1"
        )
    for refused in (from_env, given):
        assert "must be an http or https URL" in str(refused.value)
        assert SECRET not in str(refused.value)


def test_a_relay_url_with_credentials_is_refused_and_a_client_never_shows_them() -> None:
    with pytest.raises(ValueError, match="must not hold a user or password") as refused:
        MultiSigQuorumConfig(
            enabled=True,
            required_approvals=1,
            peer_agent_ids=["beta"],
            peer_public_keys={
                "beta": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBEKkn1nWDxnDQ2dlyCCY3PTYbUhyPy9BNx1+iKHMMOw"
            },
            peer_relay_urls={"beta": f"http://beta:{SECRET}@127.0.0.1:8702"},
            high_risk_patterns=["shell.*"],
            timeout_seconds=60,
        )
    assert SECRET not in str(refused.value)
    # A client built with such a URL by a caller of the library: its errors and repr say the host.
    client = RelayClient(f"http://relay:{SECRET}@127.0.0.1:{closed_port()}", token="t" * 32, timeout=2.0)
    with client, pytest.raises(RelayError) as failed:
        client.get_inbox_item("0" * 32, origin="beta")
    assert SECRET not in str(failed.value)
    assert SECRET not in repr(client)
